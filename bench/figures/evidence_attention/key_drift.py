"""Ad hoc diagnostic: how much a frame's keys (pre-RoPE, k_proj outputs) in each layer change with the
history streamed before it. The same probe frames fed after 0, 30, 150 and 599 frames of one episode;
cosine similarity of each layer's keys at the probe frame's tokens to those with no history."""
import sys, json
import torch
from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.evaluation import frame_times
from infmllm_ros.synthetic import generate_episode
torch.set_num_threads(1)
session = StreamingSession(SessionConfig(model_path=None, cache_policy="full"))
episode = generate_episode(2000, 600.0)
times = frame_times(600.0)
frames = [episode.render(t) for t in times]
layers = session.model.get_decoder().layers if hasattr(session.model.get_decoder(), "layers") else session.model.model.language_model.layers
captured = {}
hooks = [layer.self_attn.k_proj.register_forward_hook(lambda m, i, o, n=n: captured.__setitem__(n, o[0].detach().clone()))
         for n, layer in enumerate(layers)]
probes = [599, 450, 300]          # probe frames (their own content), each fed after H earlier frames
result = {}
for probe in probes:
    reference = None
    for history in (0, 30, 150, 299):
        session.reset()
        for k in range(probe - history, probe):
            session.add_frame(frames[k], stamp=times[k])
        captured.clear()
        session.add_frame(frames[probe], stamp=times[probe])
        keys = [captured[n] for n in range(len(layers))]          # (tokens, kv_dim) per layer
        if reference is None:
            reference = keys
        sims = [round(float(torch.nn.functional.cosine_similarity(k, r, dim=-1).mean()), 4) for k, r in zip(keys, reference)]
        result.setdefault(history, []).append(sims)
        print(probe, history, sims, flush=True)
print("history: mean cosine similarity to no history, per layer (0..5)")
for history, rows in result.items():
    print(history, [round(sum(r[l] for r in rows) / len(rows), 4) for l in range(len(layers))])
for h in hooks: h.remove()
