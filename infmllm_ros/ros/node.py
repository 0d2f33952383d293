"""`infmllm_node`: camera topics in, answers to ~/query out, through one bounded-cache MLLM session.

Threads, and why: camera and query callbacks only decode, check and store (they never touch the
model), so a long answer cannot block a camera; a timer at frame_rate_hz hands each camera's
newest unseen frame to the worker queue; one worker thread owns the StreamingSession (it is not
thread-safe) and takes frames and questions in arrival order. A MultiThreadedExecutor with
separate callback groups keeps cameras, queries, timers and parameter services running side by side.

Topics: ~/query (std_msgs/String, text or JSON {"id","question"}), ~/answer (answer text),
~/answer_stream (each new piece of text as it is generated), ~/answer_info (JSON per query:
answered, refused or error, with reason and timings), ~/stats (JSON every stats_period_s).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np
import rclpy
import torch
from rcl_interfaces.msg import ParameterDescriptor, ParameterType, SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.exceptions import InvalidParameterTypeException, NameValidationException, ParameterException
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.logging import get_logger
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String

from infmllm_ros.engine.loading import ModelLoadError
from infmllm_ros.engine.session import Answer, SessionConfig, StreamingSession
from infmllm_ros.models import embedded_model_path

from .image_conversion import ImageConversionError, compressed_to_rgb, image_to_rgb, stamp_seconds
from .parameters import BY_NAME, PARAMETERS, ParameterError, check, check_all, session_settings
from .queries import BUSY, MALFORMED, Query, QueryIds, QueryRejected, RequestQueue, decode_string_cdr, echo, parse_query
from .stats import NodeStats, ThrottledReport

NODE_NAME = "infmllm_node"
# DDS history of ~/query and ~/answer_info: a burst this large is queued or refused one by one
# instead of being overwritten inside DDS, where the node could not even count it.
QUERY_HISTORY = 1000
STOP_JOIN_S = 10.0
_ROS_TYPES = {"string": ParameterType.PARAMETER_STRING, "integer": ParameterType.PARAMETER_INTEGER,
              "double": ParameterType.PARAMETER_DOUBLE, "string_array": ParameterType.PARAMETER_STRING_ARRAY}
_RELIABLE = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)


@dataclass
class Frame:
    rgb: np.ndarray
    stamp: float       # header stamp, seconds
    received: float    # time.monotonic() at the callback, for ingest latency


class LatestFrames:
    """One slot per camera holding its newest decoded frame until the frame timer takes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, Frame | None] = {}

    def put(self, camera: str, frame: Frame) -> bool:
        """Store; True when an unseen frame was overwritten (dropped)."""
        with self._lock:
            overwritten = self._slots.get(camera) is not None
            self._slots[camera] = frame
            return overwritten

    def take(self) -> list[tuple[str, Frame]]:
        with self._lock:
            taken = [(camera, frame) for camera, frame in self._slots.items() if frame is not None]
            self._slots = dict.fromkeys(self._slots)
            return taken


def info_message(query_id: str, question: str, status: str, reason: str = "", answer: Answer | None = None,
                 frames_seen: int = 0, cache_tokens: int = 0, latency_s: float | None = None) -> dict[str, Any]:
    """The ~/answer_info record of one query (status: ok | refused | error)."""
    ms = (lambda s: None if s is None else round(s * 1000.0, 3))
    return {"id": query_id, "question": echo(question), "answer": answer.text if answer else "", "status": status,
            "reason": reason, "stamp": answer.newest_frame_stamp if answer else None,
            "frames_seen": answer.frames_seen if answer else frames_seen,
            "cache_tokens": answer.cache_tokens if answer else cache_tokens,
            "tokens": answer.tokens if answer else 0, "ttft_ms": ms(answer.ttft_s) if answer else None,
            "total_ms": ms(answer.total_s) if answer else None, "latency_ms": ms(latency_s)}


def declare_parameters(node: Node) -> dict[str, Any]:
    """Declare the table of parameters.py on `node`; their checked values (ParameterError if refused)."""
    values = {}
    for spec in PARAMETERS:
        note = " (read-only after start)" if spec.read_only else ""
        descriptor = ParameterDescriptor(name=spec.name, type=_ROS_TYPES[spec.type], read_only=spec.read_only,
                                         description=spec.description + note)
        # An empty list cannot carry its type, so an empty default is declared by type alone.
        default = spec.default if spec.default != [] else Parameter.Type.STRING_ARRAY
        values[spec.name] = node.declare_parameter(spec.name, default, descriptor).value
    return check_all(values)


class Cancelled(Exception):
    """Raised inside the model's forward once the worker is stopping: abandons the work in hand."""


class SessionWorker:
    """The one thread that owns the session: feeds frames and answers queries, in queue order.

    It knows nothing of ROS: replies go out through the callables it is given. Stopping cancels
    at the next model forward (a torch pre-hook), so even an answer that shows no text yet ends
    within one token.
    """

    def __init__(self, session: StreamingSession, queue: RequestQueue, stats: NodeStats,
                 settings: dict[str, Any], publish_piece: Callable[[str], None],
                 publish_reply: Callable[[dict[str, Any]], None], report: Callable[[str, str], None]) -> None:
        self.session, self.queue, self.stats, self.settings = session, queue, stats, settings
        self.publish_piece, self.publish_reply, self.report = publish_piece, publish_reply, report
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infmllm_worker", daemon=True)
        session.model.register_forward_pre_hook(self._cancellation_point)

    def _cancellation_point(self, module, args) -> None:
        if self.stopping.is_set():
            raise Cancelled()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_JOIN_S) -> bool:
        """Cancel the work in progress at its next forward and join; False if it did not end in time."""
        self.stopping.set()
        self.queue.close()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self.stopping.is_set():
            item = self.queue.get(timeout=0.5)
            if item is None:
                continue
            kind, camera, payload = item
            try:
                if kind == "frame":
                    self._feed(camera, payload)
                else:
                    self._answer(payload)
            except Cancelled:
                return
            except Exception as error:  # a bug must not kill the only thread that answers
                self.report("internal", f"worker: {type(error).__name__}: {error}")
                if kind == "query":
                    self.stats.count_query("error")
                    self._reply(info_message(payload.id, payload.question, "error", f"internal error: {error}"))

    def _feed(self, camera: str, frame: Frame) -> None:
        try:
            timing = self.session.add_frame(frame.rgb, stamp=frame.stamp)
        except ValueError as error:  # the model cannot take this frame (e.g. too many tokens)
            self.stats.count_bad("image.rejected_by_model")
            self.stats.count_frame(camera, "bad")
            self.report("image.rejected_by_model", f"{camera}: {error}")
            return
        self.stats.count_frame(camera, "fed")
        self.stats.add_latency("ingest", timing.seconds)
        self.stats.add_latency("frame_age", time.monotonic() - frame.received)
        self._publish_engine_state()

    def _answer(self, query: Query) -> None:
        self.stats.set_engine(answering=True)
        pieces = self.session.stream(query.question, max_new_tokens=self.settings["max_new_tokens"])
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
            self._reply(info_message(query.id, query.question, "error", str(error), **self._engine_state()))
            return
        finally:
            self.stats.set_engine(answering=False)
            self._publish_engine_state()
        latency = time.monotonic() - query.received
        self.stats.count_query("answered")
        self.stats.add_latency("answer", latency)
        self.stats.add_latency("ttft", answer.ttft_s)
        self._reply(info_message(query.id, query.question, "ok", answer=answer, latency_s=latency))

    def _reply(self, info: dict[str, Any]) -> None:
        if not self.stopping.is_set():
            self.publish_reply(info)

    def _engine_state(self) -> dict[str, int]:
        return {"frames_seen": self.stats.engine("frames_seen"), "cache_tokens": self.stats.engine("cache_tokens")}

    def _publish_engine_state(self) -> None:
        self.stats.set_engine(cache_tokens=self.session.cache_tokens, cache_bytes=self.session.cache_bytes,
                              frames_seen=self.session.frames_seen)


class InfMLLMNode(Node):
    """Wiring only: parameters, QoS, topics, timers; the work is in SessionWorker and plain modules."""

    def __init__(self, **node_kwargs: Any) -> None:
        super().__init__(NODE_NAME, **node_kwargs)
        self.settings = declare_parameters(self)  # ParameterError on a bad value
        self.stats = NodeStats()
        self._reports = ThrottledReport()
        self._query_ids = QueryIds()
        self._frames = LatestFrames()
        self._queue = RequestQueue(self.settings["query_queue_size"])
        if self.settings["torch_threads"] > 0:
            torch.set_num_threads(self.settings["torch_threads"])
        session = StreamingSession(SessionConfig(**session_settings(self.settings)))  # ModelLoadError, ValueError
        self.get_logger().info(
            f"model {session.family} from {self.settings['model_path'] or 'the embedded model'}, cache policy "
            f"{self.settings['cache_policy']} (budget {self.settings['cache_budget']} tokens)")

        self._answer_pub = self.create_publisher(String, "~/answer", _RELIABLE)
        self._stream_pub = self.create_publisher(String, "~/answer_stream", QoSProfile(
            depth=100, reliability=QoSReliabilityPolicy.RELIABLE))
        self._info_pub = self.create_publisher(String, "~/answer_info", QoSProfile(
            depth=QUERY_HISTORY, reliability=QoSReliabilityPolicy.RELIABLE))
        self._stats_pub = self.create_publisher(String, "~/stats", _RELIABLE)

        cameras = ReentrantCallbackGroup()  # cameras decode in parallel; each only writes its own slot
        self._timer_group = MutuallyExclusiveCallbackGroup()
        camera_qos = qos_profile_sensor_data if self.settings["image_qos"] == "sensor_data" else QoSProfile(
            depth=5, reliability=QoSReliabilityPolicy.RELIABLE)
        self._subscriptions_by_camera = {}
        for topics, msg_type, convert in ((self.settings["image_topics"], Image, image_to_rgb),
                                          (self.settings["compressed_image_topics"], CompressedImage,
                                           compressed_to_rgb)):
            for topic in topics:
                camera = self.resolve_topic_name(topic)  # remappings applied: the name stats report
                self._subscriptions_by_camera[camera] = self.create_subscription(
                    msg_type, topic, partial(self._on_image, camera, convert), camera_qos, callback_group=cameras)
                self.stats.add_camera(camera)
        # Raw: rclpy would decode invalid UTF-8 into U+FFFD without telling (see queries.decode_string_cdr).
        self.create_subscription(String, "~/query", self._on_query, QoSProfile(
            depth=QUERY_HISTORY, reliability=QoSReliabilityPolicy.RELIABLE),
            callback_group=MutuallyExclusiveCallbackGroup(), raw=True)  # one at a time: answers keep query order
        self._frame_timer = self.create_timer(1.0 / self.settings["frame_rate_hz"], self._hand_frames,
                                              callback_group=self._timer_group)
        self._stats_timer = self.create_timer(self.settings["stats_period_s"], self._publish_stats,
                                              callback_group=self._timer_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)

        self._worker = SessionWorker(session, self._queue, self.stats, self.settings, self._publish_piece,
                                     self._publish_reply, self._report)
        self._worker.start()
        self.get_logger().info(f"watching {sorted(self._subscriptions_by_camera)}; questions on "
                               f"{self.resolve_topic_name('~/query')}")

    # ---- parameters ----------------------------------------------------------------------------

    def _on_set_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        updates = {}
        for parameter in parameters:
            if parameter.name not in BY_NAME:
                continue  # rclpy's own (use_sim_time, ...)
            try:
                updates[parameter.name] = check(parameter.name, parameter.value)
            except ParameterError as error:
                return SetParametersResult(successful=False, reason=str(error))
        self.settings.update(updates)
        if "query_queue_size" in updates:
            self._queue.max_queries = updates["query_queue_size"]
        if "frame_rate_hz" in updates:
            self.destroy_timer(self._frame_timer)
            self._frame_timer = self.create_timer(1.0 / updates["frame_rate_hz"], self._hand_frames,
                                                  callback_group=self._timer_group)
        if "stats_period_s" in updates:
            self.destroy_timer(self._stats_timer)
            self._stats_timer = self.create_timer(updates["stats_period_s"], self._publish_stats,
                                                  callback_group=self._timer_group)
        return SetParametersResult(successful=True)

    # ---- callbacks: decode, check, store; never the model --------------------------------------

    def _on_image(self, camera: str, convert, msg) -> None:
        self.stats.count_frame(camera, "received")
        try:
            rgb = convert(msg, self.settings["max_image_pixels"])
        except ImageConversionError as error:
            self.stats.count_frame(camera, "bad")
            self._bad_input(f"image.{error.kind}", f"{camera}: {error}")
            return
        except Exception as error:  # nothing a sender does may stop the node
            self.stats.count_frame(camera, "bad")
            self._bad_input("image.internal", f"{camera}: {type(error).__name__}: {error}")
            return
        stamp = stamp_seconds(msg) or time.time()
        if self._frames.put(camera, Frame(rgb, stamp, time.monotonic())):
            self.stats.count_frame(camera, "dropped")

    def _on_query(self, raw: bytes) -> None:
        self.stats.count_query("received")
        try:
            text = decode_string_cdr(raw)
            if text is None:  # an encapsulation our decoder does not know: rclpy's (lossy) one
                text = deserialize_message(raw, String).data
            query = parse_query(text, self._query_ids, self.settings["max_query_chars"])
        except QueryRejected as rejected:
            self._bad_input(f"query.{rejected.kind}", rejected.reason)
            self._refuse(rejected.query_id or self._query_ids(), rejected.question, rejected.reason)
            return
        except Exception as error:
            self._bad_input(f"query.{MALFORMED}", f"{type(error).__name__}: {error}")
            self._refuse(self._query_ids(), "", f"malformed query: {error}")
            return
        if not self._queue.put_query(query):
            self.stats.count_query(BUSY)
            self._refuse(query.id, query.question, f"busy: {self._queue.max_queries} questions are already "
                                                   "waiting (query_queue_size); ask again later")

    def _hand_frames(self) -> None:
        for camera, frame in self._frames.take():
            if self._queue.put_frame(camera, frame):
                self.stats.count_frame(camera, "dropped")

    def _publish_stats(self) -> None:
        snapshot = self.stats.snapshot(stamp=time.time(), queued_queries=self._queue.pending_queries)
        self._publish(self._stats_pub, json.dumps(snapshot))

    # ---- replies --------------------------------------------------------------------------------

    def _refuse(self, query_id: str, question: str, reason: str) -> None:
        self.stats.count_query("refused")
        self._publish_reply(info_message(query_id, question, "refused", reason,
                                         frames_seen=self.stats.engine("frames_seen"),
                                         cache_tokens=self.stats.engine("cache_tokens")))

    def _publish_reply(self, info: dict[str, Any]) -> None:
        if info["status"] == "ok":
            self._publish(self._answer_pub, info["answer"])
        self._publish(self._info_pub, json.dumps(info))

    def _publish_piece(self, piece: str) -> None:
        self._publish(self._stream_pub, piece)

    def _publish(self, publisher, text: str) -> None:
        try:
            publisher.publish(String(data=text))
        except Exception:  # the context went down under us (SIGINT): nothing left to tell
            if self.context.ok():
                raise

    def _bad_input(self, kind: str, message: str) -> None:
        self.stats.count_bad(kind)
        self._report(kind, message)

    def _report(self, kind: str, message: str) -> None:
        suppressed = self._reports.due(kind)
        if suppressed is not None:
            more = f" ({suppressed} more of this kind since the last report)" if suppressed else ""
            self.get_logger().warning(f"[{kind}] {message}{more}")

    def close(self) -> bool:
        """Stop the worker (cancelling an answer at its next token) and join it; False if it is still running."""
        if self._worker.stop():
            return True
        # Not the node's logger: after SIGINT its context (and /rosout) is gone.
        get_logger(NODE_NAME).warning(f"the model did not stop within {STOP_JOIN_S:.0f} s")
        return False


def main(args: list[str] | None = None) -> int:
    """Console entry `infmllm_node`: run until SIGINT; exit 2 with one error line on bad settings."""
    rclpy.init(args=args)
    try:
        node = InfMLLMNode()
    except (ParameterError, ParameterException, ModelLoadError, ValueError, NameValidationException) as error:
        hint = ""
        if isinstance(error, InvalidParameterTypeException):
            hint = " (a double needs a decimal point, e.g. 2.0)"
        elif isinstance(error, ModelLoadError) and str(embedded_model_path()) in str(error):
            hint = (" (the embedded model is not in this install: train it with "
                    "`python -m infmllm_ros.tiny_model.train`, or set model_path)")
        print(f"{NODE_NAME}: error: {error}{hint}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    except KeyboardInterrupt:  # SIGINT while the model was loading
        rclpy.try_shutdown()
        return 0
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        # rclpy's handler also passes SIGINT on to Python's, whose KeyboardInterrupt may only land
        # now, in the middle of joining the worker: ignore it (and any repeat) while shutting down.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        joined = node.close()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    if not joined:  # a forward longer than STOP_JOIN_S: leave now rather than abort in torch at exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
