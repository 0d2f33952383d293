"""Garbage-collector pauses: timed for ~/stats, and kept short by freezing the loaded model's objects.

A collection of CPython's oldest generation walks every tracked object while holding the GIL, so
every thread of the node stops with it: camera callbacks, the query callback, the worker. With a
model and rclpy loaded that is ~380,000 objects, about 0.2 s a collection on a 2-core machine, and
one comes whenever enough new objects have survived (decoded images, tensors' Python wrappers,
messages). `gc.freeze()` after the model is loaded moves everything then alive into a permanent
generation that collections skip (CPython documents it for exactly this: after start-up, before
serving); cleanup unfreezes it, so the model's objects can be collected when it is freed.
Knows nothing of ROS.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Iterator

from .stats import LATENCY_WINDOW, LatencyWindow

OLDEST = 2


def freeze_loaded_heap() -> int:
    """Collect once, then exempt every object alive now from later collections; returns how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze_heap() -> None:
    """Let collections see the frozen objects again (before freeing the model they belong to)."""
    gc.unfreeze()


class GcPauses:
    """Durations of the collector's passes, per generation.

    The callback runs in whichever thread triggered a collection, possibly while that thread holds
    a lock (NodeStats' included), so it only appends to deques (atomic under the GIL) and takes no
    lock; summary() is read from the stats timer.

    `frozen_objects` is recorded by whoever freezes (the node, at configure) rather than asked of the
    collector: `gc.get_freeze_count()` walks the whole frozen generation, ~35 ms for a loaded model's
    380,000 objects while holding the GIL, and a 1 Hz stats timer calling it stalled every other
    thread of the node that long each second (py-spy on the node suite).
    """

    def __init__(self, size: int = LATENCY_WINDOW) -> None:
        self._samples = [deque(maxlen=size) for _ in range(OLDEST + 1)]
        self._counts = [0] * (OLDEST + 1)
        self._started: float | None = None
        self._deliberate = False
        self.frozen_objects = 0
        self.total_s = 0.0   # every recorded pause added up: slow_work.WorkClock reports its growth

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    @contextmanager
    def deliberate(self) -> Iterator[None]:
        """Collections the node asks for (freezing at configure, freeing at cleanup) are not the
        pauses a robot suffers while serving: not recorded."""
        self._deliberate = True
        try:
            yield
        finally:
            self._deliberate = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if self._deliberate:
            self._started = None
        elif phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = min(int(info.get("generation", OLDEST)), OLDEST)
            paused = time.perf_counter() - self._started
            self._samples[generation].append(paused)
            self.total_s += paused
            self._counts[generation] += 1
            self._started = None

    def summary(self) -> dict[str, Any]:
        """{"gen0": {p50_ms, p95_ms, p99_ms, max_ms, count}, ..., "frozen_objects": n}"""
        result: dict[str, Any] = {}
        for generation, samples in enumerate(self._samples):
            window = LatencyWindow(len(samples) or 1)
            for seconds in list(samples):
                window.add(seconds)
            result[f"gen{generation}"] = {**window.summary(), "count": self._counts[generation]}
        result["frozen_objects"] = self.frozen_objects
        return result
