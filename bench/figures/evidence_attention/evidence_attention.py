"""Ad hoc diagnostic: where the last prompt token of each long/distant question attends, whole stream,
every key kept, shipped weights. Per question: for every layer and KV head, the share of attention
(averaged over the head group) on the evidence frames' tokens, against their share of the keys
(chance); for colour-of-shape distant questions, where layer 2's top-20 keys per KV head lie.
SHARPEN=layer:factor multiplies that layer's attention logits at inference.

usage: python evidence_attention.py MODEL_DIR|'' SEED,SEED DURATION_S OUT.json"""
import os, sys, json, time, collections
import torch
import infmllm_ros.evaluation as ev
from infmllm_ros.engine.session import SessionConfig, StreamingSession

model_path = sys.argv[1] if len(sys.argv) > 1 else None
seeds = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2000, 2001]
duration = float(sys.argv[3]) if len(sys.argv) > 3 else 600.0
out = sys.argv[4] if len(sys.argv) > 4 else "build/evals13/evidence_attention.json"
torch.set_num_threads(2)
if os.environ.get("SHARPEN"):   # "layer:factor": that layer's logits x factor at inference
    from transformers import AttentionInterface
    from infmllm_ros.engine import attention as A
    _layer, _factor = (float(x) for x in os.environ["SHARPEN"].split(":"))
    _original = A.scoring_attention

    def _sharpened(module, query, key, value, attention_mask, scaling=None, **kwargs):
        if module.layer_idx == int(_layer):
            scaling = (scaling if scaling is not None else query.shape[-1] ** -0.5) * _factor
        return _original(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    AttentionInterface.register(A.SCORING_ATTENTION, _sharpened)
session = StreamingSession(SessionConfig(model_path=model_path or None, cache_policy="h2o", cache_budget=32768))   # scoring attention, nothing evicted
records = []
original_ask = ev.ask


def ask(session, question, seed, result, frames=None, forget=False):
    if question.family not in ("long", "distant") or question.evidence is None or session.frames_seen == 0:
        return original_ask(session, question, seed, result, frames, forget)
    spans = [s for s in frames.within(*question.evidence) if s[1] > s[0]]
    prompt = session.prompt.question.format(question=question.text.strip())
    ids = session.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    session._forward({"input_ids": ids[:, :-1]})
    seen = {}
    cache = session.cache
    cache.add_attention_mass = lambda index, mass, _orig=type(cache).add_attention_mass: (
        seen.__setitem__(index, mass.detach().clone()), _orig(cache, index, mass))[1]
    try:
        logits = session._forward({"input_ids": ids[:, -1:]})[0]
    finally:
        del cache.add_attention_mass
    decoding = session._decode(logits, session.config.max_new_tokens, time.perf_counter())
    try:
        while True:
            next(decoding)
    except StopIteration as done:
        text = done.value[0]
    answer = text.strip().lower()
    group = session.model.config.get_text_config().num_attention_heads // cache.layers[0].keys.shape[1]
    shares, chance = [], None
    for index, layer in enumerate(cache.layers):
        token_index = layer.token_index[:, :seen[index].shape[-1]]   # the keys of that forward (answer tokens came after)
        evidence = torch.zeros_like(token_index, dtype=torch.bool)
        for start, end in spans:
            evidence |= (token_index >= start) & (token_index < end)
        mass = seen[index] / group          # (kv_heads, K): one query's probabilities, group-averaged
        shares.append([round(float(mass[h][evidence[h]].sum()), 4) for h in range(mass.shape[0])])
        chance = round(float(evidence[0].float().mean()), 5)
    top = []
    if question.kind == "colour_of_shape_distant":
        episode = ev.generate_episode(seed, duration)
        shape = question.text.split("the ")[1].split(" seen")[0]
        layer = cache.layers[2]
        mass = seen[2]
        head = int(max(range(mass.shape[0]), key=lambda h: float(mass[h][(layer.token_index[h, :mass.shape[-1]] >= 0)].max())))
        for h in range(mass.shape[0]):
            order = mass[h].argsort(descending=True)[:20]
            for slot in order.tolist():
                index = int(layer.token_index[h, slot])
                where = [stamp for stamp, (a, b) in zip(frames.stamps, frames.spans) if a <= index < b]
                if where:
                    shapes = [o.shape for o in episode.visible(where[0])]
                    top.append({"head": h, "mass": round(float(mass[h][slot]) / group, 4), "frame_t": where[0],
                                "evidence": any(a <= index < b for a, b in spans), "has_shape": shape in shapes,
                                "shapes": shapes})
                else:
                    top.append({"head": h, "mass": round(float(mass[h][slot]) / group, 4), "frame_t": None,
                                "evidence": False, "has_shape": False, "shapes": []})
    records.append({"top_layer2": top, "seed": seed, "t": question.t, "family": question.family, "kind": question.kind,
                    "question": question.text, "expected": question.answer, "answer": answer,
                    "right": answer == question.answer, "keys": int(seen[0].shape[-1]),
                    "evidence_frames": len(spans), "chance": chance, "evidence_share": shares})
    result.total[question.family] += 1
    result.correct[question.family] += int(answer == question.answer)
    result.count_kind(question.kind, int(answer == question.answer), 1)


ev.ask = ask
result = ev.EvalResult()
for seed in seeds:
    ev.evaluate_episode(session, seed, duration, result)
    print(seed, dict(result.correct), dict(result.total), flush=True)
print("by kind:", json.dumps(result.by_kind))
json.dump(records, open(out, "w"), indent=1)
# summary: per family x kind x right, mean over questions of the best head's share, and per layer (max over heads)
groups = collections.defaultdict(list)
for r in records:
    groups[(r["family"], r["kind"].replace("colour_of_shape", "cos").replace("shape_of_colour", "soc"), r["right"])].append(r)
layers = len(records[0]["evidence_share"]) if records else 0
tops = [t for r in records for t in r["top_layer2"]]
if tops:
    n = len(tops)
    print(f"colour-of-shape distant, layer 2's top-20 keys per KV head ({n} keys): on the evidence {sum(t['evidence'] for t in tops) / n:.3f}, "
          f"in another frame showing the asked shape {sum(t['has_shape'] and not t['evidence'] for t in tops) / n:.3f}, "
          f"in a frame without it {sum((t['frame_t'] is not None) and not t['has_shape'] for t in tops) / n:.3f}, "
          f"text (questions, answers) {sum(t['frame_t'] is None for t in tops) / n:.3f}")
print("family kind right n | chance | best head | per layer (max over KV heads)")
for key, rs in sorted(groups.items()):
    best = sum(max(max(h) for h in r["evidence_share"]) for r in rs) / len(rs)
    per_layer = [round(sum(max(r["evidence_share"][l]) for r in rs) / len(rs), 3) for l in range(layers)]
    ch = sum(r["chance"] for r in rs) / len(rs)
    print(*key, len(rs), "|", round(ch, 4), "|", round(best, 3), "|", per_layer)
