"""Scale suite: how memory and latency evolve along one stream, per policy, from seconds to an hour.

A bounded policy should show flat cache tokens, MB, RSS and per-frame cost once past its budget;
`full` grows without limit. Frames come from the synthetic world at 1 Hz. At every checkpoint a
question is asked (time to first token) and a few decoding steps are timed (ms per output token).
Each policy runs in its own process, so peak RSS is its own.
"""

from __future__ import annotations

import statistics
import time

from tqdm import tqdm

from infmllm_ros.engine.session import DEFAULT_RECALL_STORE_MB
from infmllm_ros.synthetic import generate_episode

from .measure import decode_ms_per_token, gpu_peak_mb, in_child, make_session, peak_rss_mb, rss_mb, synchronize

#: a policy plus session settings: infmllm with recall at the node's default store, so what recall
#: adds over an hour (store MB, RSS, time to first token) sits beside the policy alone
VARIANTS = {"infmllm+recall": ("infmllm", {"recall_store_mb": DEFAULT_RECALL_STORE_MB})}
POLICIES = ("full", "streaming", "h2o", "infmllm", *VARIANTS)
METRICS = ("cache_tokens", "cache_mb", "store_mb", "rss_mb", "peak_rss_mb", "ingest_ms", "ttft_ms", "decode_ms")
QUESTION = "how many objects are in view?"
BASE_FRAMES = 100   # ratios are reported against this checkpoint


def stream_frames(count: int, seed: int = 5):
    """`count` 1 Hz frames, rendered before any timed loop: a pool of up to 600 distinct ones repeats
    (a sixth of the stream, at least 32, so short smoke runs do not spend their time rendering)."""
    size = min(count, 600, max(32, count // 6))
    episode = generate_episode(seed, size + 1.0)
    pool = [episode.render(float(t) + 0.5) for t in range(size)]
    return [pool[i % len(pool)] for i in range(count)]


def scale_one_policy(model_path, policy: str, checkpoints, budget: int, recent: int, overrides: dict,
                     window: int = 16) -> list[dict]:
    """Rows for one policy at each checkpoint (run in a child process by run_scale).

    ingest_ms is the median over the `window` frames just before the checkpoint, so one eviction
    does not dominate it (its cost is spread as in real use).
    """
    base, settings = VARIANTS.get(policy, (policy, {}))
    session = make_session(model_path, base, budget, recent, **{**overrides, **settings})
    frames = stream_frames(max(checkpoints))
    timings, rows, marks = [], [], set(checkpoints)
    for index, frame in enumerate(tqdm(frames, desc=f"scale {policy}", unit="frame", leave=False), start=1):
        started = time.perf_counter()
        session.add_frame(frame, stamp=float(index))
        synchronize(session)
        timings.append(time.perf_counter() - started)
        if index in marks:
            answer = session.ask(QUESTION)
            row = {"policy": policy, "frames": index, "cache_tokens": session.cache_tokens,
                   "cache_mb": session.cache_bytes / 2**20,
                   "store_mb": session.cache.store.megabytes if session.cache.store is not None else 0.0,
                   "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(),
                   "ingest_ms": 1000 * statistics.median(timings[-window:]),
                   "ttft_ms": 1000 * answer.ttft_s, "decode_ms": decode_ms_per_token(session, 8)}
            if (gpu_mb := gpu_peak_mb(session)) is not None:
                row["gpu_peak_mb"] = gpu_mb
            rows.append(row)
    return rows


def run_scale(model_path, checkpoints, budget: int, recent: int, policies=POLICIES, full_max_frames: int = 3600,
              overrides: dict | None = None) -> list[dict]:
    """All policies' rows; `full` stops at `full_max_frames` (its cost grows with the stream)."""
    rows = []
    for policy in tqdm(policies, desc="scale policies", unit="policy"):
        marks = [c for c in checkpoints if policy != "full" or c <= full_max_frames]
        rows += in_child(scale_one_policy, model_path, policy, marks, budget, recent, overrides or {})
    return rows


def ratios(rows: list[dict], base: int = BASE_FRAMES) -> list[dict]:
    """Per policy: each metric at its last checkpoint divided by the same metric at `base` frames."""
    out = []
    for policy in dict.fromkeys(row["policy"] for row in rows):
        mine = {row["frames"]: row for row in rows if row["policy"] == policy}
        last = max(mine)
        if base not in mine or last == base:
            continue
        ratio = {"policy": policy, "frames": f"{last}/{base}"}
        for metric in METRICS:
            ratio[metric] = mine[last][metric] / mine[base][metric] if mine[base][metric] else float("nan")
        out.append(ratio)
    return out
