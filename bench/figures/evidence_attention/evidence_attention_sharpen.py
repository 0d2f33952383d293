"""Ad hoc diagnostic: where the last prompt token of each long/distant question attends, whole stream,
full cache, shipped weights. Per question: for every layer and KV head, the share of attention (averaged
over the head group) on the evidence frames' tokens, against their share of the keys (chance)."""
import sys, json, time, collections
import torch
import infmllm_ros.evaluation as ev
from infmllm_ros.engine.session import SessionConfig, StreamingSession

model_path = sys.argv[1] if len(sys.argv) > 1 else None
seeds = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2000, 2001]
duration = float(sys.argv[3]) if len(sys.argv) > 3 else 600.0
out = sys.argv[4] if len(sys.argv) > 4 else "build/evals13/evidence_attention.json"
torch.set_num_threads(2)
import os
if os.environ.get("SHARPEN"):   # "layer:factor": that layer's logits x factor at inference
    from transformers import AttentionInterface
    from infmllm_ros.engine import attention as A
    _layer, _factor = int(os.environ["SHARPEN"].split(":")[0]), float(os.environ["SHARPEN"].split(":")[1])
    _original = A.scoring_attention
    def _sharpened(module, query, key, value, attention_mask, scaling=None, **kwargs):
        if module.layer_idx == _layer:
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
    records.append({"seed": seed, "t": question.t, "family": question.family, "kind": question.kind,
                    "question": question.text, "expected": question.answer, "answer": answer,
                    "right": answer == question.answer, "keys": int(seen[0].shape[-1]),
                    "evidence_frames": len(spans), "chance": chance, "evidence_share": shares})
    result.total[question.family] += 1
    result.correct[question.family] += int(answer == question.answer)


ev.ask = ask
result = ev.EvalResult()
for seed in seeds:
    ev.evaluate_episode(session, seed, duration, result)
    print(seed, dict(result.correct), dict(result.total), flush=True)
json.dump(records, open(out, "w"), indent=1)
# summary: per family x kind x right, mean over questions of the best head's share, and per layer (max over heads)
groups = collections.defaultdict(list)
for r in records:
    groups[(r["family"], r["kind"].replace("colour_of_shape", "cos").replace("shape_of_colour", "soc"), r["right"])].append(r)
layers = len(records[0]["evidence_share"]) if records else 0
print("family kind right n | chance | best head | per layer (max over KV heads)")
for key, rs in sorted(groups.items()):
    best = sum(max(max(h) for h in r["evidence_share"]) for r in rs) / len(rs)
    per_layer = [round(sum(max(r["evidence_share"][l]) for r in rs) / len(rs), 3) for l in range(layers)]
    ch = sum(r["chance"] for r in rs) / len(rs)
    print(*key, len(rs), "|", round(ch, 4), "|", round(best, 3), "|", per_layer)
