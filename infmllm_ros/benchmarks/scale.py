"""Scale suite: how cache size and per-frame cost evolve along a stream, per policy.

A bounded policy should show flat cache tokens, MB and ingest time once past its budget; `full`
grows without limit. Frames come from the synthetic world at 1 Hz.
"""

from __future__ import annotations

import statistics
import time

from tqdm import tqdm

from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.synthetic import generate_episode

POLICIES = ("full", "streaming", "h2o", "infmllm")


def stream_frames(count: int, seed: int = 5):
    """`count` distinct 1 Hz frames (rendering is cached outside the timed region)."""
    episode = generate_episode(seed, min(count, 600) + 1.0)
    pool = [episode.render(float(t) + 0.5) for t in range(min(count, 600))]
    return [pool[i % len(pool)] for i in range(count)]


def run_scale(model_path, checkpoints, budget: int, recent: int, policies=POLICIES, window: int = 16):
    """Rows of {policy, frames, cache_tokens, cache_mb, ingest_ms} measured at each checkpoint.

    ingest_ms is the median over the `window` frames just before the checkpoint, so one
    eviction does not dominate it (its amortised cost is spread as in real use).
    """
    frames = stream_frames(max(checkpoints))
    rows = []
    for policy in policies:
        session = StreamingSession(SessionConfig(model_path=model_path, cache_policy=policy, cache_budget=budget,
                                                 recent_window=recent))
        timings = []
        marks = set(checkpoints)
        for index, frame in enumerate(tqdm(frames, desc=f"scale {policy}", unit="frame", leave=False), start=1):
            started = time.perf_counter()
            session.add_frame(frame, stamp=float(index))
            timings.append(time.perf_counter() - started)
            if index in marks:
                rows.append({"policy": policy, "frames": index, "cache_tokens": session.cache_tokens,
                             "cache_mb": session.cache_bytes / 2**20,
                             "ingest_ms": 1000 * statistics.median(timings[-window:])})
    return rows
