"""Overhead suite: what choosing survivors costs each policy, in one run on one machine.

Two views. Per step: a frame stream and then token-by-token decoding under the same budget, with
the time spent in eviction (choosing survivors and re-indexing positions) split from the rest.
`h2o per-token` evicts at every decoding step, as H2O's reference implementation does, which is
where the paper's "about 2x faster than H2O" would come from; the other policies evict once per
`chunk` tokens. Selection alone: `keep_indices` on synthetic attention mass at growing cache sizes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
from tqdm import tqdm

from infmllm_ros.engine.policies import make_policy

from .measure import decode_timings, make_session, synchronize
from .scale import stream_frames

CONFIGS = ("streaming", "h2o", "h2o per-token", "infmllm")


def step_costs(model_path, config: str, frames: list, decode_steps: int, budget: int, recent: int,
               overrides: dict) -> dict:
    """Per-frame and per-token cost, and the share of it spent evicting."""
    policy = config.split()[0]
    session = make_session(model_path, policy, budget, recent, **overrides)
    started = time.perf_counter()
    for index, frame in enumerate(frames):
        session.add_frame(frame, stamp=float(index))
    synchronize(session)
    frame_s = time.perf_counter() - started
    frame_evict_s = session.cache.eviction_seconds
    if config.endswith("per-token"):
        # Evict one token per step from here on (H2O's schedule); frames need a chunk of >= 17.
        session.cache.policy = dataclasses.replace(session.policy, chunk=1)
    evict_before = session.cache.eviction_seconds
    timings = decode_timings(session, decode_steps)
    decode_evict_s = session.cache.eviction_seconds - evict_before
    return {"config": config, "frame_ms": 1000 * frame_s / len(frames),
            "frame_evict_ms": 1000 * frame_evict_s / len(frames),
            "token_ms": 1000 * statistics.mean(timings), "token_evict_ms": 1000 * decode_evict_s / decode_steps,
            "cache_tokens": session.cache_tokens}


def selection_costs(lengths, budget: int, recent: int, heads: int = 2, repeats: int = 20,
                    device: str = "cpu") -> list[dict]:
    """Median time of one `keep_indices` call per policy and cache length (mass is random)."""
    rows = []
    for length in lengths:
        mass = torch.rand(heads, length, device=device)
        for name in ("streaming", "h2o", "infmllm"):
            settings = dict(budget=min(budget, length - 1), chunk=64)
            if name != "streaming":
                settings["recent"] = min(recent, settings["budget"] // 2)
            policy = make_policy(name, **settings)
            timings = []
            for _ in range(repeats):
                started = time.perf_counter()
                policy.keep_indices(mass if policy.needs_attention_mass else None, length, heads)
                if mass.is_cuda:
                    torch.cuda.synchronize(mass.device)
                timings.append(time.perf_counter() - started)
            rows.append({"policy": name, "cache_length": length, "select_us": 1e6 * statistics.median(timings)})
    return rows


def run_overhead(model_path, frame_count: int, decode_steps: int, budget: int, recent: int, lengths,
                 overrides: dict | None = None, configs=CONFIGS) -> tuple[list[dict], list[dict]]:
    frames = stream_frames(frame_count)
    steps = [step_costs(model_path, config, frames, decode_steps, budget, recent, overrides or {})
             for config in tqdm(configs, desc="overhead configs", unit="config")]
    return steps, selection_costs(lengths, budget, recent, device=(overrides or {}).get("device", "cpu"))
