"""The worker's slow items, each kept with where its time went, so that a latency tail can be located.

A percentile says that one answer in a hundred took a second, not why. The worker times every frame
it feeds and every question it answers three ways: wall time, its own thread's CPU time
(`time.thread_time`) and the garbage collector's pauses meanwhile, in any thread (`GcPauses.total_s`;
every thread stops for them). Wall time well above the thread's CPU time is time the worker was not
running: waiting for the GIL (held by a camera callback decoding an image, the executor, a timer, a
collection another thread started), for a core (another process), or for torch's other threads and
devices (intra-op workers, a GPU synchronisation). An answer's
time in the queue is split off too: it is the item before it that was slow. An item that takes more
than `slow_work_factor` times the median of its kind is logged with that split, and the last
SLOW_KEPT of them stay in ~/stats with their wall-clock time, to be matched against other logs.
Knows nothing of ROS.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter, deque
from datetime import datetime, timezone
from typing import Any

SLOW_KEPT = 20          # slow items listed in ~/stats, newest last
MIN_SAMPLES = 20        # items of a kind seen before any is called slow (no median to compare with yet)
MEDIAN_EVERY = 50       # the running median is recomputed every this many items of a kind
RECENT_ITEMS = 1000     # the median is over this many latest items of a kind


class WorkClock:
    """Started as an item begins; `split()` is (wall s, this thread's CPU s, GC pause s) since then.
    Read from the thread doing the work: thread_time counts the calling thread only."""

    def __init__(self, gc_pauses=None) -> None:
        self._gc = gc_pauses
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()
        self._gc_start = gc_pauses.total_s if gc_pauses is not None else 0.0

    def split(self) -> tuple[float, float, float]:
        gc_s = (self._gc.total_s - self._gc_start) if self._gc is not None else 0.0
        return time.perf_counter() - self._wall, time.thread_time() - self._cpu, gc_s


class SlowWork:
    """Running medians per kind of work ("ingest", "answer") and the items far above them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: dict[str, deque[float]] = {}
        self._median: dict[str, float] = {}
        self._seen: Counter = Counter()
        self._slow: Counter = Counter()
        self._kept: deque[dict[str, Any]] = deque(maxlen=SLOW_KEPT)

    def observe(self, kind: str, seconds: float, split: tuple[float, float, float], factor: float,
                waited_s: float = 0.0, detail: str = "") -> dict[str, Any] | None:
        """Count one item of `kind` that took `seconds` in all (`waited_s` of it queued, `split` =
        WorkClock.split() of the rest); the slow record if it took more than `factor` x the median
        of the kind so far, else None. factor 0 = never slow."""
        wall_s, cpu_s, gc_s = split
        with self._lock:
            recent = self._recent.setdefault(kind, deque(maxlen=RECENT_ITEMS))
            median = self._median.get(kind)
            self._seen[kind] += 1
            slow = (factor > 0 and median is not None and self._seen[kind] > MIN_SAMPLES
                    and seconds > factor * median)
            recent.append(seconds)
            if self._seen[kind] == MIN_SAMPLES or self._seen[kind] % MEDIAN_EVERY == 0:
                self._median[kind] = statistics.median(recent)
            if not slow:
                return None
            ms = (lambda s: round(s * 1000.0, 1))
            record = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "kind": kind,
                      "ms": ms(seconds), "median_ms": ms(median), "waited_ms": ms(waited_s),
                      "worked_ms": ms(wall_s), "worker_cpu_ms": ms(cpu_s), "gc_ms": ms(gc_s),
                      "off_cpu_ms": ms(max(wall_s - cpu_s, 0.0)), "detail": detail}
            self._slow[kind] += 1
            self._kept.append(record)
            return record

    def summary(self) -> dict[str, Any]:
        """{"slow": {kind: n}, "seen": {kind: n}, "median_ms": {kind: ms}, "last": [records]}"""
        with self._lock:
            return {"slow": dict(self._slow), "seen": dict(self._seen),
                    "median_ms": {kind: round(m * 1000.0, 3) for kind, m in self._median.items()},
                    "last": list(self._kept)}


def describe(record: dict[str, Any]) -> str:
    """One log line: how slow, and where the time went."""
    ratio = record["ms"] / max(record["median_ms"], 0.001)
    return (f"{record['kind']} {record['detail']} took {record['ms']:.0f} ms ({ratio:.1f}x the median "
            f"{record['median_ms']:.0f} ms): {record['waited_ms']:.0f} ms queued, {record['worked_ms']:.0f} ms working, "
            f"of which {record['worker_cpu_ms']:.0f} ms on the worker's CPU and {record['off_cpu_ms']:.0f} ms waiting "
            f"to run (GIL, a core, torch's other threads); garbage collection meanwhile {record['gc_ms']:.0f} ms")
