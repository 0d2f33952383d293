"""Tiny model directories and frames shared by the engine tests (built once per test session)."""

from __future__ import annotations

import numpy as np

from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.testing.tiny_models import FAMILIES, save


def frames(count: int, seed: int = 0, size=(48, 64)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(count)]


def session_for(model_dir, policy: str, **overrides) -> StreamingSession:
    settings = dict(model_path=str(model_dir), cache_policy=policy, quantization="none", cache_budget=64,
                    recent_window=16, eviction_chunk=16, sink_tokens=4, max_new_tokens=4,
                    recall_store_mb=0.0)   # the policy alone; recall's tests turn it on
    settings.update(overrides)
    return StreamingSession(SessionConfig(**settings))


__all__ = ["FAMILIES", "save", "frames", "session_for"]
