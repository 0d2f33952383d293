"""Ad hoc: sharpen one layer's attention at inference (logits x f in layer L only) and score distant
questions on 600 s episodes, every key kept (scoring attention)."""
import sys, json
import torch
from transformers import AttentionInterface
import infmllm_ros.evaluation as ev
from infmllm_ros.engine import attention as A
from infmllm_ros.engine.session import SessionConfig, StreamingSession
layer, factor, seed = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(2)
original = A.scoring_attention
def sharpened(module, query, key, value, attention_mask, scaling=None, **kwargs):
    if module.layer_idx == layer:
        scaling = (scaling if scaling is not None else query.shape[-1] ** -0.5) * factor
    return original(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
AttentionInterface.register(A.SCORING_ATTENTION, sharpened)
session = StreamingSession(SessionConfig(model_path=None, cache_policy="h2o", cache_budget=32768))
result = ev.EvalResult()
for s in (seed, seed + 1):
    ev.evaluate_episode(session, s, 600.0, result)
print(json.dumps({"layer": layer, "factor": factor, "seed": seed, "correct": result.correct, "total": result.total,
                  "by_kind": {k: v for k, v in result.by_kind.items()} if hasattr(result, "by_kind") else None}))
