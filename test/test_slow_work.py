"""Slow frames and answers are singled out against their kind's median, with where their time went:
queued, on the worker's CPU, in garbage collection, or waiting to run."""

from __future__ import annotations

import gc
import time

import numpy as np

from infmllm_ros.ros.gc_pauses import GcPauses
from infmllm_ros.ros.mailbox import Frame
from infmllm_ros.ros.slow_work import MIN_SAMPLES, SLOW_KEPT, SlowWork, WorkClock, describe
from node_helpers import wait_until
from test_worker import random_model_dir, start_worker  # noqa: F401  (the fixture, and the worker it starts)


def test_an_item_is_slow_only_beyond_factor_times_its_kinds_median():
    work = SlowWork()
    split = (0.01, 0.01, 0.0)
    for _ in range(MIN_SAMPLES):
        assert work.observe("ingest", 0.010, split, factor=5.0) is None
    assert work.observe("ingest", 0.045, split, factor=5.0) is None, "4.5x the median is not slow at 5x"
    assert work.observe("answer", 1.0, split, factor=5.0) is None, "no median of answers yet"
    record = work.observe("ingest", 0.060, (0.055, 0.010, 0.005), factor=5.0, waited_s=0.005, detail="of a cam frame")
    assert record is not None and record["kind"] == "ingest" and record["ms"] == 60.0 and record["median_ms"] == 10.0
    assert (record["waited_ms"], record["worked_ms"], record["worker_cpu_ms"], record["gc_ms"]) == (5.0, 55.0, 10.0, 5.0)
    assert record["off_cpu_ms"] == 45.0, "worked - the worker's CPU"
    assert "6.0x the median" in describe(record) and "45 ms waiting to run" in describe(record)
    assert work.observe("ingest", 10.0, split, factor=0.0) is None, "factor 0: never slow"
    summary = work.summary()
    assert summary["slow"] == {"ingest": 1} and summary["seen"] == {"ingest": MIN_SAMPLES + 3, "answer": 1}
    for _ in range(SLOW_KEPT + 5):
        work.observe("ingest", 1.0, split, factor=5.0)
    assert len(work.summary()["last"]) == SLOW_KEPT, "the list stays bounded"


def test_work_clock_tells_waiting_from_computing_and_counts_collector_pauses():
    pauses = GcPauses()
    pauses.install()
    try:
        clock = WorkClock(pauses)
        time.sleep(0.2)                                   # off CPU: what a GIL wait looks like to this thread
        garbage = [[i] for i in range(300_000)]
        gc.collect()
        del garbage
        wall, cpu, gc_s = clock.split()
    finally:
        pauses.remove()
    assert wall >= 0.2 and cpu < wall - 0.15, "the sleep is wall time, not the thread's CPU time"
    assert 0 < gc_s <= wall and gc_s == pauses.total_s


def test_a_stalled_frame_is_reported_with_its_time_off_the_workers_cpu(random_model_dir):  # noqa: F811
    reports = []
    worker, queue, stats, replies = start_worker(random_model_dir, report=lambda kind, text: reports.append((kind, text)))
    stall = {"left": 0}

    def stall_once(module, args):   # the worker's thread blocked, as by another thread holding the GIL
        if stall["left"]:
            stall["left"] -= 1
            time.sleep(1.0)

    hook = worker.sessions.model.register_forward_pre_hook(stall_once)
    try:
        rgb = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
        for second in range(MIN_SAMPLES + 1):
            queue.put_frame("cam", Frame(rgb, stamp=float(second), received=time.monotonic()))
            assert wait_until(lambda: stats.snapshot()["cameras"].get("cam", {}).get("fed") == second + 1, 30)
        before = stats.snapshot()["slow_work"]["slow"].get("ingest", 0)   # a loaded machine may already have one
        stall["left"] = 1
        queue.put_frame("cam", Frame(rgb, stamp=float(MIN_SAMPLES + 1), received=time.monotonic()))
        assert wait_until(lambda: stats.snapshot()["slow_work"]["slow"].get("ingest", 0) == before + 1, 30)
        stalled = [r for r in stats.snapshot()["slow_work"]["last"] if r["ms"] >= 1000.0]
        assert len(stalled) == 1 and stalled[0]["kind"] == "ingest" and stalled[0]["off_cpu_ms"] >= 900.0
        assert "slow_work" in [kind for kind, _ in reports] and any("of a cam frame" in text for _, text in reports)
    finally:
        hook.remove()
        assert worker.stop()
