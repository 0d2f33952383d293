"""Small measurements the suites share: process memory, decode speed, a child process per run.

Each run that reports process memory happens in a fresh child process, so one policy's peak
resident set is not another's leftover (ru_maxrss only ever grows).
"""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import sys
import time

import torch

from infmllm_ros.engine.session import SessionConfig, StreamingSession


def rss_mb() -> float:
    """Resident set size of this process now, in MiB (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10   # bytes on macOS, KiB on Linux


def synchronize(session: StreamingSession) -> None:
    """Wait for the session's queued GPU work, so a timer read after it measures the step (no-op on CPU)."""
    synchronize_device(session.device)


def synchronize_device(device) -> None:
    """Wait for queued work on `device` (a torch device or its name); no-op on CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def gpu_peak_mb(session: StreamingSession) -> float | None:
    """Peak CUDA memory allocated so far, in MiB; None on CPU."""
    return torch.cuda.max_memory_allocated(session.device) / 2**20 if session.device.type == "cuda" else None


def decode_timings(session: StreamingSession, steps: int) -> list[float]:
    """Seconds of each of `steps` decoding steps (one token appended, next-token logits out)."""
    token = session.tokenizer.get_vocab().get("the", 0)
    timings = []
    for _ in range(steps):
        started = time.perf_counter()
        session.feed_token(token)
        synchronize(session)
        timings.append(time.perf_counter() - started)
    return timings


def decode_ms_per_token(session: StreamingSession, steps: int = 16) -> float:
    """Median cost of one decoding step."""
    return 1000 * statistics.median(decode_timings(session, steps))


def make_session(model_path, policy: str, budget: int, recent: int, **overrides) -> StreamingSession:
    """A session under `policy` alone (recall only where `overrides` asks for it, so a row named
    after a policy measures that policy); `recent` is clipped so small budgets stay valid."""
    recent = min(recent, max(budget // 2, 1))
    settings = {"recall_store_mb": 0.0, **overrides}
    return StreamingSession(SessionConfig(model_path=model_path, cache_policy=policy, cache_budget=budget,
                                          recent_window=recent, **settings))


def score_episodes(score, jobs: list, workers: int, progress, weight=lambda cells: 1) -> dict:
    """{seed: cells} of `score(job) -> (seed, cells)` over `jobs`, `workers` at a time in spawned
    processes (one torch thread each: the tiny model gains little from a second, and episodes are
    independent) or inline at 1; `progress` advances by `weight(cells)` as each job ends."""
    by_seed = {}
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for seed, cells in pool.imap_unordered(score, jobs):
                by_seed[seed] = cells
                progress.update(weight(cells))
    else:
        for job in jobs:
            seed, cells = score(job)
            by_seed[seed] = cells
            progress.update(weight(cells))
    return by_seed


def in_child(function, *args):
    """Run `function(*args)` in a fresh spawned process and return its result."""
    pool = multiprocessing.get_context("spawn").Pool(1)
    try:
        return pool.apply(function, args)
    finally:
        pool.close()   # close + join, not terminate: a terminated child leaks its semaphore
        pool.join()
