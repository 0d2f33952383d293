"""The worker's inbox: frames, questions and resets in arrival order, and the per-camera feed rate.

Knows nothing of ROS, so tests drive it without DDS. It is the only frame buffer of the node:
a camera callback decodes a frame, asks the FeedGate whether it is due, and puts it here; the
worker takes items in order. Two promises hold:

- a question is answered after every frame that reached the node before it (a newer frame of
  the same camera never overtakes a question by replacing an older pending one in front of it);
- memory stays bounded: a camera's pending frame that no question waits behind is replaced by
  its newer one (counted as dropped), and questions are bounded (refused as busy when full).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable

import numpy as np

FRAME, QUERY, RESET = "frame", "query", "reset"
_STAMP_SLACK_S = 1e-3  # stamps a hair early still count as due (10 Hz stamps summed in floats)
_STAMP_JUMP_BACK_S = 1.0  # a camera whose stamps jump back this far was restarted (a bag looped)


@dataclass
class Frame:
    rgb: np.ndarray
    stamp: float       # header stamp, seconds
    received: float    # time.monotonic() at the callback, for ingest latency


@dataclass
class ResetRequest:
    """A reset waiting its turn in the queue; the worker sets `done` once the cache is empty."""

    done: threading.Event = field(default_factory=threading.Event)
    frames_forgotten: int = 0


class FeedGate:
    """Which frames of each camera the model sees: one per 1/rate seconds of *header stamp* time.

    Stamps, not arrival times, so a bag replayed at any speed feeds the model the same frames
    (at 1 Hz of camera time, as the embedded model was trained), and DDS jitter cannot change
    which frames those are. Due times lie on a fixed grid from a camera's first frame, so 10 Hz
    stamps sampled at 1 Hz do not drift by a frame each second.
    """

    def __init__(self, rate_hz: float) -> None:
        self.rate_hz = rate_hz
        self._due: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def due(self, camera: Hashable, stamp: float) -> bool:
        """Whether the frame stamped `stamp` is due; it is not taken until commit() (so a frame
        that turns out malformed does not use up the camera's slot)."""
        with self._lock:
            return self._is_due(self._due.get(camera), stamp)

    def commit(self, camera: Hashable, stamp: float) -> None:
        """The frame stamped `stamp` goes to the model: move the camera's grid past it."""
        period = 1.0 / self.rate_hz
        with self._lock:
            due = self._due.get(camera)
            if due is None or stamp < due - period - _STAMP_JUMP_BACK_S:
                self._due[camera] = stamp + period
            elif stamp >= due - _STAMP_SLACK_S:
                self._due[camera] = due + period * max(1, math.ceil((stamp - due + _STAMP_SLACK_S) / period))

    def admit(self, camera: Hashable, stamp: float) -> bool:
        """due() and commit() in one: True when the frame is due (and now taken)."""
        with self._lock:
            if not self._is_due(self._due.get(camera), stamp):
                return False
        self.commit(camera, stamp)
        return True

    def _is_due(self, due: float | None, stamp: float) -> bool:
        # a camera whose stamps jump back (a bag looped, a simulator restarted) starts again
        return due is None or stamp >= due - _STAMP_SLACK_S or stamp < due - 1.0 / self.rate_hz - _STAMP_JUMP_BACK_S

    def forget(self) -> None:
        """Start every camera's grid again at its next frame (after a reset)."""
        with self._lock:
            self._due.clear()


class RequestQueue:
    """Frames, queries and resets in arrival order (thread-safe).

    At most `max_queries` queries wait (put_query refuses beyond that).
    """

    def __init__(self, max_queries: int) -> None:
        self.max_queries = max_queries
        self._items: deque[tuple[str, Hashable, Any]] = deque()
        self._queries = 0
        self._closed = False
        self._ready = threading.Condition()

    def put_query(self, query: Any) -> bool:
        with self._ready:
            if self._closed or self._queries >= self.max_queries:
                return False
            self._items.append((QUERY, None, query))
            self._queries += 1
            self._ready.notify()
            return True

    def put_reset(self, request: ResetRequest) -> bool:
        with self._ready:
            if self._closed:
                return False
            self._items.append((RESET, None, request))
            self._ready.notify()
            return True

    def put_frame(self, camera: Hashable, frame: Any) -> bool:
        """Queue a frame; True when it replaced (dropped) an older pending frame of the same camera.

        Only a pending frame with nothing but frames behind it is replaced, so order stays
        chronological and no question loses a frame that arrived before it.
        """
        with self._ready:
            if self._closed:
                return False
            replaced = False
            for index in range(len(self._items) - 1, -1, -1):
                kind, key, _ = self._items[index]
                if kind != FRAME:
                    break
                if key == camera:
                    del self._items[index]
                    replaced = True
                    break
            self._items.append((FRAME, camera, frame))
            self._ready.notify()
            return replaced

    def get(self, timeout: float | None = None) -> tuple[str, Hashable, Any] | None:
        """The oldest item as (kind, camera or None, payload); None on timeout or once closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while not self._items and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._ready.wait(left)
            if self._closed or not self._items:
                return None
            item = self._items.popleft()
            if item[0] == QUERY:
                self._queries -= 1
            return item

    def close(self) -> list[tuple[str, Any]]:
        """Stop handing out items; returns the (kind, payload) of queries and resets still waiting."""
        with self._ready:
            self._closed = True
            waiting = [(kind, payload) for kind, _, payload in self._items if kind != FRAME]
            self._items.clear()
            self._queries = 0
            self._ready.notify_all()
            return waiting

    @property
    def closed(self) -> bool:
        with self._ready:
            return self._closed

    @property
    def pending_queries(self) -> int:
        with self._ready:
            return self._queries
