"""The one thread that owns the model sessions: feeds frames, answers questions, resets, in queue order.

Knows nothing of ROS (replies leave through the callables it is given), so tests drive it with a
real session and no DDS. Its promise: every query it takes or that is waiting when it stops gets
exactly one reply (answered, refused or error); none is dropped, none answered twice.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from infmllm_ros.engine.session import Answer

from .camera_sessions import CameraSessions, UnknownCamera
from .mailbox import FRAME, QUERY, Frame, RequestQueue, ResetRequest
from .queries import Query, echo
from .slow_work import WorkClock, describe
from .stats import NodeStats

STOP_JOIN_S = 10.0
# Refusal codes the worker gives (the node adds busy, inactive and the query-parsing kinds).
NO_FRAMES, UNKNOWN_CAMERA, INACTIVE, SHUTDOWN = "no_frames", "unknown_camera", "inactive", "shutdown"
_REASONS = {
    NO_FRAMES: "no_frames: no frame of this camera has reached the model yet (check image_topics and that the "
               "camera publishes)",
    UNKNOWN_CAMERA: "unknown_camera: the node does not watch this camera",
    INACTIVE: "inactive: the node was deactivated before this question was answered",
    SHUTDOWN: "shutdown: the node stopped before this question was answered",
}


def info_message(query_id: Any, question: str, status: str, reason: str = "", answer: Answer | None = None,
                 frames_seen: int = 0, cache_tokens: int = 0, latency_s: float | None = None,
                 refusal: str = "", camera: str | None = None) -> dict[str, Any]:
    """The ~/answer_info record of one query (status: ok | refused | error; refusal: the short code;
    camera: whose frames the answer is about, stamp: that camera's newest frame)."""
    ms = (lambda s: None if s is None else round(s * 1000.0, 3))
    return {"id": query_id, "question": echo(question), "answer": answer.text if answer else "", "status": status,
            "reason": reason, "refusal": refusal, "camera": camera,
            "stamp": answer.newest_frame_stamp if answer else None,
            "frames_seen": answer.frames_seen if answer else frames_seen,
            "cache_tokens": answer.cache_tokens if answer else cache_tokens,
            "tokens": answer.tokens if answer else 0, "ttft_ms": ms(answer.ttft_s) if answer else None,
            "total_ms": ms(answer.total_s) if answer else None, "latency_ms": ms(latency_s),
            "recalled_stamps": list(answer.recalled_stamps) if answer else []}


class Cancelled(Exception):
    """Raised inside the model's forward once the worker is cancelled: abandons the work in hand."""


class SessionWorker:
    """Takes frames, questions and resets from `queue` in order and works them on `session`.

    stop() ends it in one of two ways: finishing the item in hand (deactivate: the cache stays
    whole for the next activate) or cancelling it at the model's next forward (shutdown: a torch
    pre-hook, so even an answer that shows no text yet ends within one token). Either way the
    questions still waiting are refused with the stop's reason.
    """

    def __init__(self, sessions: CameraSessions, queue: RequestQueue, stats: NodeStats,
                 settings: dict[str, Any], publish_piece: Callable[[str], None],
                 publish_reply: Callable[[dict[str, Any]], None], report: Callable[[str, str], None],
                 gc_pauses=None) -> None:
        self.sessions, self.queue, self.stats, self.settings = sessions, queue, stats, settings
        self.gc_pauses = gc_pauses   # GcPauses, when the node times the collector: slow items' GC share
        self.publish_piece, self.publish_reply, self.report = publish_piece, publish_reply, report
        self._cancel = threading.Event()
        self._stopping = threading.Event()
        self._stop_code = SHUTDOWN
        self._thread = threading.Thread(target=self._run, name="infmllm_worker", daemon=True)
        self._hook = None

    def start(self) -> None:
        self._hook = self.sessions.model.register_forward_pre_hook(self._cancellation_point)
        self._thread.start()

    def stop(self, code: str = SHUTDOWN, cancel: bool = True, timeout: float = STOP_JOIN_S) -> bool:
        """Stop taking work, refuse what waits with `code`; False if the thread did not end in time."""
        self._stop_code = code
        if cancel:
            self._cancel.set()
        self._stopping.set()
        for kind, payload in self.queue.close():
            if kind == QUERY:
                self._refuse(payload, code)
            else:
                payload.done.set()   # a reset still waiting: nothing to forget any more
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._hook is not None and not self._thread.is_alive():
            self._hook.remove()
            self._hook = None
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _cancellation_point(self, module, args) -> None:
        if self._cancel.is_set():
            raise Cancelled()

    def _run(self) -> None:
        while not self._stopping.is_set():
            item = self.queue.get(timeout=0.5)
            if item is None:
                continue
            kind, camera, payload = item
            try:
                if kind == FRAME:
                    self._feed(camera, payload)
                elif kind == QUERY:
                    self._answer(payload)
                else:
                    self._reset(payload)
            except Cancelled:
                if kind == QUERY:
                    self._refuse(payload, self._stop_code)
                return
            except Exception as error:  # a bug must not kill the only thread that answers
                self.report("internal", f"worker: {type(error).__name__}: {error}")
                if kind == QUERY:
                    self.stats.count_query("error")
                    self.publish_reply(info_message(payload.id, payload.question, "error",
                                                    f"internal error: {error}", **self._engine_state()))
                elif kind == FRAME:
                    self.stats.count_frame(camera, "failed")
                    self.stats.count_bad("image.feed_failed")
                else:
                    payload.done.set()

    def _feed(self, camera: str, frame: Frame) -> None:
        clock = WorkClock(self.gc_pauses)
        try:
            timing = self.sessions.session(camera)[1].add_frame(frame.rgb, stamp=frame.stamp)
        except ValueError as error:  # the model cannot take this frame (e.g. too many tokens)
            self.stats.count_bad("image.rejected_by_model")
            self.stats.count_frame(camera, "bad")
            self.report("image.rejected_by_model", f"{camera}: {error}")
            return
        self.stats.count_frame_tokens(timing.tokens, timing.pruned)
        self.stats.count_frame(camera, "fed")
        self.stats.add_latency("ingest", timing.seconds)
        self.stats.add_latency("frame_age", time.monotonic() - frame.received)
        self._publish_engine_state()
        split = clock.split()
        self._note_if_slow("ingest", split[0], split, detail=f"of a {camera} frame")

    def _answer(self, query: Query) -> None:
        clock = WorkClock(self.gc_pauses)
        waited = time.monotonic() - query.received
        self.stats.add_latency("query_wait", waited)
        try:
            camera, session = self.sessions.session(query.camera)
        except UnknownCamera:
            self._refuse(query, UNKNOWN_CAMERA, f" {query.camera!r}; it watches {sorted(self.sessions.sessions)}")
            return
        if session.frames_seen == 0:
            self._refuse(query, NO_FRAMES, camera=camera)
            return
        self.stats.set_engine(answering=True)
        pieces = session.stream(query.question, max_new_tokens=self.settings["max_new_tokens"])
        try:
            while True:
                try:
                    piece = next(pieces)
                except StopIteration as done:
                    answer: Answer = done.value
                    break
                self.publish_piece(piece)
        except ValueError as error:  # the engine refused the question
            self.stats.count_query("error")
            self.publish_reply(info_message(query.id, query.question, "error", str(error), camera=camera,
                                            **self._engine_state()))
            return
        finally:
            self.stats.set_engine(answering=False)
            self._publish_engine_state()
        latency, split = time.monotonic() - query.received, clock.split()
        self.stats.count_query("answered")
        self.stats.count_recall(len(answer.recalled_stamps))
        self.stats.add_latency("answer", latency)
        self.stats.add_latency("ttft", answer.ttft_s)
        self.publish_reply(info_message(query.id, query.question, "ok", answer=answer, latency_s=latency,
                                        camera=camera))
        self._note_if_slow("answer", latency, split, waited_s=waited,
                           detail=f"to query {echo(str(query.id))} ({answer.tokens} tokens)")

    def _note_if_slow(self, kind: str, seconds: float, split: tuple[float, float, float], waited_s: float = 0.0,
                      detail: str = "") -> None:
        record = self.stats.slow_work.observe(kind, seconds, split, self.settings["slow_work_factor"],
                                              waited_s=waited_s, detail=detail)
        if record is not None:
            self.report("slow_work", describe(record))

    def _reset(self, request: ResetRequest) -> None:
        request.frames_forgotten = self.sessions.reset()
        self._publish_engine_state()
        self.stats.count_reset()
        request.done.set()

    def _refuse(self, query: Query, code: str, detail: str = "", camera: str | None = None) -> None:
        self.stats.count_query("refused")
        self.stats.count_query(code)
        self.publish_reply(info_message(query.id, query.question, "refused", _REASONS[code] + detail, refusal=code,
                                        camera=camera, **self._engine_state()))

    def _engine_state(self) -> dict[str, int]:
        return {"frames_seen": self.stats.engine("frames_seen"), "cache_tokens": self.stats.engine("cache_tokens")}

    def _publish_engine_state(self) -> None:
        self.stats.set_engine(cache_tokens=self.sessions.cache_tokens, cache_bytes=self.sessions.cache_bytes,
                              frames_seen=self.sessions.frames_seen,
                              recall_store_bytes=self.sessions.recall_store_bytes,
                              recall_frames_stored=self.sessions.recall_frames_stored)
