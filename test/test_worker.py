"""The node's ROS-free core: the mailbox (order, bounds, feed rate) and the worker that owns a real
session (every query gets exactly one reply; reset; stopping), driven without DDS."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from infmllm_ros.engine.session import SessionConfig
from infmllm_ros.ros.camera_sessions import CameraSessions
from infmllm_ros.ros.mailbox import FeedGate, Frame, RequestQueue, ResetRequest
from infmllm_ros.ros.parameters import defaults
from infmllm_ros.ros.queries import Query
from infmllm_ros.ros.stats import NodeStats
from infmllm_ros.ros.worker import INACTIVE, NO_FRAMES, SHUTDOWN, UNKNOWN_CAMERA, SessionWorker
from node_helpers import save_babbling_model, wait_until
from infmllm_ros.testing.tiny_models import save

# ---- the mailbox ------------------------------------------------------------------------------


def test_a_newer_frame_never_overtakes_a_question():
    queue = RequestQueue(max_queries=5)
    question = Query("a", "qa")
    queue.put_frame("left", "L1")
    queue.put_frame("right", "R1")
    queue.put_query(question)
    assert queue.put_frame("left", "L2") is False, "L1 stays: the question must be answered after it"
    assert queue.put_frame("left", "L3") is True, "L2 has only frames behind it: replaced (dropped)"
    assert [queue.get(0)[2] for _ in range(4)] == ["L1", "R1", question, "L3"]


def test_feed_gate_takes_one_frame_per_period_of_stamp_time():
    gate = FeedGate(1.0)
    stamps = [1000.0 + i * 0.1 for i in range(100)]          # 10 s of a 10 Hz camera
    fed = [stamp for stamp in stamps if gate.admit("cam", stamp)]
    assert len(fed) == 10 and all(abs(b - a - 1.0) < 1e-6 for a, b in zip(fed, fed[1:])), "no drift"
    assert gate.admit("other", 1000.05), "cameras have their own grids"
    assert gate.admit("cam", 20.0), "stamps jumping back (a looped bag) start the grid again"
    assert not gate.admit("cam", 20.5) and gate.admit("cam", 21.0)


def test_feed_gate_slot_taken_only_on_commit():
    gate = FeedGate(2.0)
    assert gate.due("cam", 5.0) and gate.due("cam", 5.1), "a bad frame (never committed) leaves the slot free"
    gate.commit("cam", 5.1)
    assert not gate.due("cam", 5.3) and gate.due("cam", 5.6)
    gate.forget()
    assert gate.due("cam", 5.3)


# ---- the worker, on a real session ------------------------------------------------------------

@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory):
    return save("llava-llama", tmp_path_factory.mktemp("random_llava"))


@pytest.fixture(scope="module")
def babbling_dir(tmp_path_factory):
    return save_babbling_model(tmp_path_factory.mktemp("babbling_llava"))


class Replies:
    """What the worker publishes, by query id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.infos: list[dict] = []
        self.pieces: list[str] = []

    def reply(self, info: dict) -> None:
        with self._lock:
            self.infos.append(info)

    def piece(self, text: str) -> None:
        with self._lock:
            self.pieces.append(text)

    def by_id(self) -> dict:
        with self._lock:
            return {info["id"]: info for info in self.infos}

    def count(self) -> Counter:
        with self._lock:
            return Counter(info["id"] for info in self.infos)


def start_worker(model_dir, max_new_tokens: int = 4, max_queries: int = 50, cameras=("cam",), report=None,
                 **settings):
    settings = {"cache_policy": "full", **settings}
    sessions = CameraSessions(SessionConfig(model_path=str(model_dir), max_new_tokens=max_new_tokens, **settings),
                              list(cameras))
    queue, stats, replies = RequestQueue(max_queries), NodeStats(), Replies()
    worker = SessionWorker(sessions, queue, stats, {**defaults(), "max_new_tokens": max_new_tokens}, replies.piece,
                           replies.reply, report or (lambda kind, message: None))
    worker.start()
    return worker, queue, stats, replies


def frame() -> Frame:
    return Frame(np.full((48, 64, 3), 128, np.uint8), stamp=1.0, received=0.0)


def test_no_frames_refused_then_answered_in_order(random_model_dir):
    worker, queue, stats, replies = start_worker(random_model_dir)
    try:
        queue.put_query(Query("before", "what colour is the circle?"))
        queue.put_frame("cam", frame())
        queue.put_query(Query(7, "what colour is the circle?"))
        assert wait_until(lambda: len(replies.infos) == 2, 60)
        infos = replies.by_id()
        assert infos["before"]["status"] == "refused" and infos["before"]["refusal"] == NO_FRAMES
        assert infos[7]["status"] == "ok" and infos[7]["frames_seen"] == 1, "an integer id stays an integer"
        snapshot = stats.snapshot()
        assert snapshot["queries"]["no_frames"] == 1 and snapshot["queries"]["answered"] == 1
    finally:
        assert worker.stop()


def test_reset_waits_its_turn_and_empties_the_history(random_model_dir):
    worker, queue, stats, replies = start_worker(random_model_dir)
    try:
        reset = ResetRequest()
        queue.put_frame("cam", frame())
        queue.put_query(Query("old", "how many objects are in view?"))
        queue.put_reset(reset)
        queue.put_query(Query("new", "how many objects are in view?"))
        assert reset.done.wait(60) and reset.frames_forgotten == 1
        assert wait_until(lambda: len(replies.infos) == 2, 60)
        infos = replies.by_id()
        assert infos["old"]["status"] == "ok", "asked before the reset: answered about the old history"
        assert infos["new"]["refusal"] == NO_FRAMES, "after the reset no frame is left"
        assert worker.sessions.cache_tokens == 0 and stats.snapshot()["resets"] == 1
    finally:
        assert worker.stop()


@pytest.mark.parametrize("cancel, code", [(True, SHUTDOWN), (False, INACTIVE)])
def test_stopping_replies_to_every_query_exactly_once(babbling_dir, cancel, code):
    """A never-ending answer in hand and questions waiting behind it: shutdown cancels the answer in
    hand (refused), deactivate lets it finish (ok); either way the waiting ones are refused, once."""
    worker, queue, stats, replies = start_worker(babbling_dir, max_new_tokens=400)
    queue.put_frame("cam", frame())
    ids = [f"q{i}" for i in range(6)]
    for query_id in ids:
        assert queue.put_query(Query(query_id, "what colour is the circle?"))
    assert wait_until(lambda: replies.pieces, 60), "the first answer is under way"
    assert worker.stop(code, cancel=cancel)
    counts = replies.count()
    assert set(counts) == set(ids) and set(counts.values()) == {1}, counts
    infos = replies.by_id()
    assert infos["q0"]["status"] == ("refused" if cancel else "ok")
    assert all(infos[query_id]["refusal"] == code for query_id in ids[1:])
    assert stats.snapshot()["queries"][code] == len(ids) - (0 if cancel else 1)
    assert not queue.put_query(Query("late", "x")), "a stopped worker's queue takes nothing more"


def test_cameras_never_share_a_cache(random_model_dir):
    """Two cameras, one model: each question is answered from its own camera's frames only."""
    worker, queue, stats, replies = start_worker(random_model_dir, cameras=("/left", "/right"))
    try:
        sessions = worker.sessions.sessions
        assert sessions["/left"].model is sessions["/right"].model, "the weights are loaded once"
        for stamp in (1.0, 2.0):
            queue.put_frame("/left", Frame(np.zeros((48, 64, 3), np.uint8), stamp=stamp, received=0.0))
        queue.put_query(Query("default", "what is in view?"))               # the first camera with frames
        queue.put_query(Query("right", "what is in view?", camera="/right"))
        queue.put_query(Query("nowhere", "what is in view?", camera="/rear"))
        queue.put_frame("/right", Frame(np.zeros((48, 64, 3), np.uint8), stamp=9.0, received=0.0))
        queue.put_query(Query("right-fed", "what is in view?", camera="/right"))
        assert wait_until(lambda: len(replies.infos) == 4, 60)
        infos = replies.by_id()
        # the second left frame replaced the first, still waiting: one left frame fed, the newest
        assert infos["default"]["camera"] == "/left" and infos["default"]["frames_seen"] == 1
        assert infos["default"]["stamp"] == 2.0
        assert infos["right"]["refusal"] == NO_FRAMES, "the left camera's frames do not answer for the right"
        assert infos["nowhere"]["refusal"] == UNKNOWN_CAMERA and "/left" in infos["nowhere"]["reason"]
        assert infos["right-fed"]["camera"] == "/right" and infos["right-fed"]["frames_seen"] == 1
        assert infos["right-fed"]["stamp"] == 9.0
        assert stats.snapshot()["frames_seen"] == 2
    finally:
        assert worker.stop()


def test_recall_is_reported_in_the_answer_and_in_stats_and_reset_empties_the_store(random_model_dir):
    worker, queue, stats, replies = start_worker(random_model_dir, cache_policy="infmllm", cache_budget=48,
                                                 recent_window=16, eviction_chunk=16, recall_store_mb=4,
                                                 recall_frames=2)
    try:
        rng = np.random.default_rng(0)
        for second in range(30):   # one at a time: the mailbox keeps only a camera's newest frame
            queue.put_frame("cam", Frame(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), stamp=float(second),
                                         received=0.0))
            assert wait_until(lambda: worker.sessions.frames_seen == second + 1, 30)
        queue.put_query(Query("q", "what colour is the circle?"))
        assert wait_until(lambda: len(replies.infos) == 1, 60)
        info = replies.by_id()["q"]
        assert info["status"] == "ok" and len(info["recalled_stamps"]) == 2
        assert all(0.0 <= stamp < 30.0 for stamp in info["recalled_stamps"])
        recall = stats.snapshot()["recall"]
        assert recall["frames_stored"] > 0 and 0 < recall["store_mb"] <= 4
        assert recall["frames_recalled"] == 2 and recall["frames_per_answer"] == 2.0
        reset = ResetRequest()
        queue.put_reset(reset)
        assert reset.done.wait(60)
        assert stats.snapshot()["recall"]["frames_stored"] == 0, "a reset forgets the stored frames too"
    finally:
        assert worker.stop()


def test_pruned_tokens_are_reported_in_stats(random_model_dir):
    worker, queue, stats, replies = start_worker(random_model_dir, prune_similarity=0.99)
    try:
        still = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
        for second in range(4):   # a static camera: every frame after the first repeats all its patches
            queue.put_frame("cam", Frame(still.copy(), stamp=float(second), received=0.0))
            assert wait_until(lambda: stats.snapshot()["cameras"].get("cam", {}).get("fed") == second + 1, 30)
        session = worker.sessions.session("cam")[1]
        visual = session.pruner.visual_tokens // 4
        pruning = stats.snapshot()["pruning"]
        assert pruning["pruned_per_frame"] == 3 * visual / 4
        assert pruning["appended_per_frame"] == session.cache.tokens_seen / 4
    finally:
        assert worker.stop()
