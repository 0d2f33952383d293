"""Node end-to-end suite: a long 30 Hz camera bag replayed into the node over DDS, with timed queries.

Three processes as on a robot (node, bag player, this observer). Reported: frames received, fed
and skipped (the node feeds `frame_rate_hz` of stamp time and skips the rest, by design), answer
latency as the observer sees it (query heard on DDS -> answer heard on DDS) and as the node times it (query
received -> answer published), and the ratio of node latency to engine-only latency: the same
questions asked of a bare StreamingSession fed the same episode at the same rate, in this process,
with the torch thread count the node runs with (one on 2 cores: the default leaves a core to DDS),
twice: back to back (`engine`), and paced as the bag plays, each frame and question at its stream
time (`engine_paced`), since a model that waits up to a second between events answers slower
(colder caches, presumably) than one that runs without a pause (the 600 s run of 2026-12-07: p50 19.6 -> 25.7 ms).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.evaluation import EvalResult, evaluate_episode
from infmllm_ros.ros.demo import run_node_on_bag
from infmllm_ros.ros.node import torch_threads
from infmllm_ros.ros.parameters import defaults, session_settings
from infmllm_ros.ros.run import default_params_file, node_parameters
from infmllm_ros.ros.stats import percentile
from infmllm_ros.synthetic.demo_bag import write_demo_bag

BAG_SEED = 11
BAG_RATE_HZ = 30.0


def node_values(params: Path) -> dict:
    """The parameter values the node runs with from this params file."""
    values = defaults()
    values.update(node_parameters(params))
    return values


def node_session_config(params: Path) -> SessionConfig:
    """The SessionConfig the node builds from this params file, for the engine-only run."""
    return SessionConfig(**session_settings(node_values(params)))


def latency_summary(prefix: str, seconds: list[float]) -> dict:
    return {f"{prefix}_p{q}_ms": 1000 * percentile(seconds, q) if seconds else float("nan") for q in (50, 95, 99)}


def gc_columns(pauses: dict) -> dict:
    """The node's garbage-collector passes (gc_pauses.py): full ones and the longest of any kind."""
    oldest = pauses.get("gen2", {})
    longest = max((pauses.get(f"gen{g}", {}).get("max_ms") or 0.0 for g in range(3)), default=0.0)
    return {"gc_full_count": oldest.get("count", 0), "gc_full_max_ms": oldest.get("max_ms") or 0.0,
            "gc_max_ms": longest, "gc_frozen_objects": pauses.get("frozen_objects", 0)}


def slow_work_columns(slow: dict) -> dict:
    """The node's slow frames and answers (ros/slow_work.py): how many of each, and where the time of
    the slowest of the last ones listed went; the list itself under slow_items."""
    last = slow.get("last", [])
    worst = max(last, key=lambda record: record["ms"], default={})
    return {"slow_ingest": slow.get("slow", {}).get("ingest", 0), "slow_answer": slow.get("slow", {}).get("answer", 0),
            "slowest_kind": worst.get("kind", ""), "slowest_ms": worst.get("ms", 0.0),
            **{f"slowest_{part}_ms": worst.get(f"{part}_ms", 0.0) for part in ("waited", "worker_cpu", "gc", "off_cpu")},
            "slow_items": last}


def real_time_pace() -> Callable[[float], None]:
    """A wait_until for evaluate_episode: stream time t happens t seconds after the first call."""
    start = None

    def wait_until(t: float) -> None:
        nonlocal start
        start = time.monotonic() - t if start is None else start
        time.sleep(max(0.0, start + t - time.monotonic()))
    return wait_until


def engine_latencies(params: Path, duration_s: float) -> tuple[list[float], list[float], int]:
    """Answer seconds of one bare session on the bag's episode, back to back and then paced in real
    time, under the node's own torch thread count (so the ratio is what the node adds), and that
    thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads(node_values(params)["torch_threads"]))
    try:
        engine = StreamingSession(node_session_config(params))
        runs = []
        for pace in (None, real_time_pace()):   # evaluate_episode starts each run from an empty cache
            result = EvalResult()
            evaluate_episode(engine, BAG_SEED, duration_s, result, wait_until=pace)
            runs.append([answer["total_s"] for answer in result.answers])
        return runs[0], runs[1], torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)


def run_node_e2e(duration_s: float, bag_dir: Path, params: Path | None = None, grace: float = 60.0) -> dict:
    """One row: counters, latencies and the node/engine latency ratio."""
    params = params or default_params_file()
    write_demo_bag(bag_dir, seed=BAG_SEED, duration_s=duration_s, rate_hz=BAG_RATE_HZ)
    run = run_node_on_bag(bag_dir, params=params, grace=grace, show=False, replay_progress=True)
    if not run.ok:
        raise RuntimeError("the node did not start; see its log above")
    cameras = (run.last_stats or {}).get("cameras", {})
    counts = {name: sum(camera.get(name, 0) for camera in cameras.values())
              for name in ("received", "skipped", "dropped", "bad", "fed")}
    answered = [info for info in run.infos.values() if info["status"] == "ok"]
    observed = [info["heard_at"] - run.query_heard[info["id"]] for info in answered if info["id"] in run.query_heard]
    in_node = [info["latency_ms"] / 1000 for info in answered if info.get("latency_ms") is not None]

    engine_only, engine_paced, engine_threads = engine_latencies(params, duration_s)

    row = {"bag_s": duration_s, "bag_hz": BAG_RATE_HZ, "torch_threads": engine_threads,
           "frames_in_bag": int(duration_s * BAG_RATE_HZ), **counts,
           "questions": len(run.questions), "answered": len(answered),
           "refused_or_failed": len(run.infos) - len(answered),
           "unanswered": len({q["id"] for q in run.questions} - set(run.infos)),
           "accuracy": 100 * len(run.correct) / max(len(run.questions), 1)}
    row.update(latency_summary("observed", observed))
    row.update(latency_summary("node", in_node))
    row.update(latency_summary("engine", engine_only))
    row.update(latency_summary("engine_paced", engine_paced))
    # where a slow answer's time went: waiting in the node's queue (behind frames being fed) or the
    # answer itself; and what the executor was held by (camera callbacks) and feeding cost
    row.update(latency_summary("node_wait", [(info["latency_ms"] - info["total_ms"]) / 1000 for info in answered
                                             if info.get("latency_ms") is not None and info.get("total_ms") is not None]))
    row.update(latency_summary("node_answer", [info["total_ms"] / 1000 for info in answered
                                               if info.get("total_ms") is not None]))
    windows = (run.last_stats or {}).get("latency", {})
    for name in ("ingest", "image_callback"):
        for key in ("p50_ms", "p99_ms", "max_ms"):
            row[f"{name}_{key}"] = windows.get(name, {}).get(key, float("nan"))
    row.update(gc_columns((run.last_stats or {}).get("gc_pauses", {})))
    row.update(slow_work_columns((run.last_stats or {}).get("slow_work", {})))
    # the node's CPU over its life (model loading included) per second of it: one spinning thread is 1.0
    stats = run.last_stats or {}
    row["node_cpu_share"] = stats.get("cpu_s", float("nan")) / max(stats.get("uptime_s", 0.0), 1e-9)
    for reference in ("engine", "engine_paced"):
        for q in (50, 95):
            row[f"node_over_{reference}_p{q}"] = row[f"node_p{q}_ms"] / row[f"{reference}_p{q}_ms"]
    row["observed_over_engine_p50"] = row["observed_p50_ms"] / row["engine_p50_ms"]
    return row
