"""What the node counts and times, as one JSON-ready dict for ~/stats (thread-safe).

Callbacks and the worker thread update it concurrently; one lock guards everything because every
update is a few integer operations. Latency percentiles are over a sliding window, so ~/stats
shows how the node behaves now, not averaged over its lifetime.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict, deque
from typing import Any, Iterable

from .slow_work import SlowWork

LATENCY_WINDOW = 1000  # samples per latency kept for percentiles


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of values; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


class LatencyWindow:
    """The last LATENCY_WINDOW durations of one kind, summarised as p50/p95/p99/max milliseconds
    (the tail is what a robot notices: one answer seconds late)."""

    def __init__(self, size: int = LATENCY_WINDOW) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self.count = 0

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)
        self.count += 1

    def summary(self) -> dict[str, Any]:
        ms = (lambda s: None if s is None else round(s * 1000.0, 3))
        return {"p50_ms": ms(percentile(self._samples, 50)), "p95_ms": ms(percentile(self._samples, 95)),
                "p99_ms": ms(percentile(self._samples, 99)), "max_ms": ms(max(self._samples, default=None)),
                "count": self.count}


class NodeStats:
    """Counters per camera, bad inputs per kind, queries per outcome, latencies, cache size.

    Per camera, received = skipped (not due at frame_rate_hz, by design) + dropped (replaced
    before the model could take it: the model is slower than the feed rate) + bad + failed
    (the model raised while feeding it) + fed, plus at most the frames still waiting.
    """

    CAMERA_COUNTERS = ("received", "skipped", "dropped", "bad", "failed", "fed")
    QUERY_OUTCOMES = ("received", "answered", "refused", "busy", "no_frames", "unknown_camera", "inactive",
                      "shutdown", "error")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._cameras: dict[str, Counter] = defaultdict(Counter)
        self._bad: Counter = Counter()
        self._queries: Counter = Counter()
        self._latency: dict[str, LatencyWindow] = defaultdict(LatencyWindow)
        self._engine: dict[str, Any] = {"cache_tokens": 0, "cache_bytes": 0, "frames_seen": 0, "answering": False,
                                        "recall_store_bytes": 0, "recall_frames_stored": 0}
        self._resets = 0
        self._recalled_frames = 0
        self._frame_tokens = Counter()   # appended / pruned: tokens of the frames fed (temporal pruning)
        self.slow_work = SlowWork()   # has its own lock: the worker records into it between frames

    def add_camera(self, camera: str) -> None:
        with self._lock:
            counts = self._cameras[camera]   # a camera subscribed again (re-activate) keeps its counts
            for name in self.CAMERA_COUNTERS:
                counts.setdefault(name, 0)

    def count_frame(self, camera: str, counter: str, n: int = 1) -> None:
        with self._lock:
            self._cameras[camera][counter] += n

    def count_bad(self, kind: str) -> None:
        """One bad input, kind like 'image.corrupt' or 'query.not_utf8'."""
        with self._lock:
            self._bad[kind] += 1

    def count_query(self, outcome: str) -> None:
        """outcome: one of QUERY_OUTCOMES; busy, no_frames, inactive and shutdown are also counted as refused."""
        with self._lock:
            self._queries[outcome] += 1

    def count_recall(self, frames: int) -> None:
        """Stored frames put back for one answer (recall)."""
        with self._lock:
            self._recalled_frames += frames

    def count_frame_tokens(self, appended: int, pruned: int) -> None:
        """One fed frame's tokens: appended to the cache, and left out as repeats (temporal pruning).
        Averaged over every frame fed since the node started, all cameras together."""
        with self._lock:
            self._frame_tokens.update(frames=1, appended=appended, pruned=pruned)

    def count_reset(self) -> None:
        with self._lock:
            self._resets += 1

    def add_latency(self, name: str, seconds: float) -> None:
        with self._lock:
            self._latency[name].add(seconds)

    def set_engine(self, **values: Any) -> None:
        """Engine-side numbers, written by the worker that owns the session."""
        with self._lock:
            self._engine.update(values)

    def engine(self, name: str) -> Any:
        with self._lock:
            return self._engine[name]

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        with self._lock:
            engine = dict(self._engine)
            frames_fed = max(self._frame_tokens["frames"], 1)
            return {
                "uptime_s": round(time.monotonic() - self._started, 3),
                # the whole process's CPU time, every thread: a spinning executor or a busy worker shows here
                "cpu_s": round(time.process_time(), 3),
                "cameras": {camera: dict(counts) for camera, counts in self._cameras.items()},
                "bad_input": dict(self._bad),
                "queries": {name: self._queries[name] for name in self.QUERY_OUTCOMES},
                "resets": self._resets,
                "answering": engine["answering"],
                "frames_seen": engine["frames_seen"],
                "cache_tokens": engine["cache_tokens"],
                "cache_mb": round(engine["cache_bytes"] / 2**20, 3),
                "recall": {"store_mb": round(engine["recall_store_bytes"] / 2**20, 3),
                           "frames_stored": engine["recall_frames_stored"],
                           "frames_recalled": self._recalled_frames,
                           "frames_per_answer": round(self._recalled_frames / max(self._queries["answered"], 1), 3)},
                "pruning": {f"{name}_per_frame": round(self._frame_tokens[name] / frames_fed, 3)
                            for name in ("appended", "pruned")},
                "latency": {name: window.summary() for name, window in self._latency.items()},
                "slow_work": self.slow_work.summary(),
                **extra,
            }


class ThrottledReport:
    """Say so once per kind per period: the first bad input of a kind is logged, the next ones are
    counted and mentioned with the following report, so a flood cannot flood the log."""

    def __init__(self, period_s: float = 10.0) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: Counter = Counter()

    def due(self, kind: str, now: float | None = None) -> int | None:
        """None to stay quiet; otherwise how many of this kind were suppressed since the last report."""
        now = time.monotonic() if now is None else now
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.period_s:
                self._suppressed[kind] += 1
                return None
            self._last[kind] = now
            return self._suppressed.pop(kind, 0)
