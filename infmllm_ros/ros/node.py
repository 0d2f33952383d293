"""`infmllm_node`: camera topics in, answers to ~/query out, through bounded-cache MLLM sessions.

A lifecycle (managed) node, as yolo_ros and llama_ros ship theirs: `configure` loads the model and
builds one session per camera (camera_sessions.py), `activate` subscribes to the cameras and starts
the worker, `deactivate` stops feeding and answering but keeps the caches, `cleanup` frees the model. With `autostart` (default)
it walks to active by itself, so `ros2 run` and `infmllm-run` give a working node in one command.

Threads, and why: camera and query callbacks only decode, check and queue (they never touch the
model), so a long answer cannot block a camera; one worker thread (worker.py) owns the sessions
(they are not thread-safe) and takes frames, questions and resets in arrival order (mailbox.py).
`infmllm_node` spins the node on a SingleThreadedExecutor: the callbacks are short (only ~/reset,
which waits for the worker to reach it, and the lifecycle transitions take longer; messages wait
in their DDS queues meanwhile), and rclpy's MultiThreadedExecutor before rclpy 10.0.4 (Kilted
ships 9.1.2) busy-loops (see main). The callback groups still say what may run side by side, for
a user who adds the node to an executor of their own.

Topics: ~/query (std_msgs/String, text or JSON {"id","question","camera"}), ~/answer (answer text),
~/answer_stream (each new piece of text as it is generated), ~/answer_info (JSON per query:
answered, refused or error, with reason and timings; exactly one per query), ~/stats (JSON every
stats_period_s). Service: ~/reset (std_srvs/Trigger) empties the caches and conversations.
"""

from __future__ import annotations

import ctypes
import difflib
import gc
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Any

import rclpy
import torch
from rcl_interfaces.msg import ParameterDescriptor, ParameterType, SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.duration import Duration
from rclpy.exceptions import ParameterException, ParameterUninitializedException
from rclpy.executors import ExternalShutdownException, ShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.logging import get_logger
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import deserialize_message
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String
from std_srvs.srv import Trigger

from infmllm_ros.engine.loading import ModelLoadError
from infmllm_ros.engine.session import SessionConfig
from infmllm_ros.models import embedded_model_path

from .camera_sessions import CameraSessions
from .gc_pauses import GcPauses, freeze_loaded_heap, unfreeze_heap
from .image_conversion import ImageConversionError, compressed_to_rgb, image_to_rgb, stamp_seconds
from .mailbox import FeedGate, Frame, RequestQueue, ResetRequest
from .parameters import BY_NAME, PARAMETERS, ParameterError, check, check_all, defaults, session_settings
from .queries import BUSY, MALFORMED, QueryIds, QueryRejected, decode_string_cdr, parse_query
from .stats import NodeStats, ThrottledReport
from .worker import INACTIVE, SHUTDOWN, STOP_JOIN_S, SessionWorker, info_message

NODE_NAME = "infmllm_node"
# DDS history of ~/query and ~/answer_info: a burst this large is queued or refused one by one
# instead of being overwritten inside DDS, where the node could not even count it.
QUERY_HISTORY = 1000
REPLY_FLUSH_S = 2.0   # at shutdown, how long the last refusals may take to be acknowledged
RESET_WAIT_S = 60.0   # a reset waits behind the answer in progress and the questions before it
_ROS_TYPES = {"string": ParameterType.PARAMETER_STRING, "integer": ParameterType.PARAMETER_INTEGER,
              "double": ParameterType.PARAMETER_DOUBLE, "boolean": ParameterType.PARAMETER_BOOL,
              "string_array": ParameterType.PARAMETER_STRING_ARRAY}
_RCLPY_OWN_PARAMETERS = ("use_sim_time", "start_type_description_service")
_RELIABLE = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)


def declare_parameters(node) -> dict[str, Any]:
    """Declare the table of parameters.py on `node`; their checked values (ParameterError if refused)."""
    declare_unchecked(node)
    return current_parameters(node)


def declare_unchecked(node) -> None:
    """Declare the table of parameters.py on `node` (values are checked at configure)."""
    for spec in PARAMETERS:
        note = " (configure-time: change it while unconfigured)" if spec.read_only else ""
        descriptor = ParameterDescriptor(name=spec.name, type=_ROS_TYPES[spec.type], description=spec.description + note)
        # An empty list cannot carry its type, so an empty default is declared by type alone.
        default = spec.default if spec.default != [] else Parameter.Type.STRING_ARRAY
        node.declare_parameter(spec.name, default, descriptor)


def current_parameters(node) -> dict[str, Any]:
    """The node's parameter values, checked (ParameterError names the first one refused)."""
    values = {}
    for spec in PARAMETERS:
        try:
            values[spec.name] = node.get_parameter(spec.name).value
        except ParameterUninitializedException:  # an empty list, declared by type alone
            values[spec.name] = None
    return check_all(values)


def unknown_overrides(node) -> list[str]:
    """Parameters given to the node (--params-file, -p) that it does not declare: ROS ignores them
    silently, so a misspelt name would do nothing. rclpy keeps them in `_parameter_overrides` and
    has no public accessor (the same attribute from Humble to Kilted)."""
    given = getattr(node, "_parameter_overrides", {})
    return sorted(name for name in given if name not in BY_NAME and name not in _RCLPY_OWN_PARAMETERS
                  and not name.startswith("qos_overrides."))


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, BY_NAME, n=1)
    return f"{name} (did you mean {close[0]}?)" if close else name


def torch_threads(setting: int) -> int:
    """The torch_threads parameter's thread count: 0 means all cores but one (at least one)."""
    return setting if setting > 0 else max(1, (os.cpu_count() or 2) - 1)


def release_memory(device: str | None) -> None:
    """Hand freed model memory back: Python's and the CUDA caching allocator's, and glibc's heap
    (malloc_trim), or the process would keep its peak size after cleanup."""
    gc.collect()
    if device and device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


class InfMLLMNode(LifecycleNode):
    """Wiring only: parameters, topics, transitions; the work is in SessionWorker and plain modules."""

    def __init__(self, **node_kwargs: Any) -> None:
        super().__init__(NODE_NAME, **node_kwargs)
        self._gc_pauses = GcPauses()   # first: destroy_node may run when a bad parameter stops __init__
        declare_unchecked(self)
        self.last_failure = ""
        unknown = unknown_overrides(self)
        if unknown:
            raise ParameterError(f"parameters the node does not have: {', '.join(map(_suggest, unknown))} "
                                 f"(known: {', '.join(sorted(BY_NAME))})")
        try:
            self.settings = current_parameters(self)
        except ParameterError as error:
            if self.get_parameter("autostart").value:
                raise   # a plain `ros2 run`: say why and exit
            # Managed: stay up, unconfigured; configure fails with this reason until it is fixed.
            self.settings = defaults()
            self.last_failure = f"parameters: {error}"
            self.get_logger().error(self.last_failure)
        self.stats = NodeStats()
        self._gc_pauses.install()
        self._reports = ThrottledReport()
        self._query_ids = QueryIds()
        self._gate = FeedGate(self.settings["frame_rate_hz"])
        self._sessions: CameraSessions | None = None   # one cache per camera, one model
        self._queue: RequestQueue | None = None
        self._worker: SessionWorker | None = None
        self._cameras: dict[str, Any] = {}
        self._camera_group = ReentrantCallbackGroup()  # cameras decode in parallel; each queues its own frames
        self.state = "unconfigured"   # the lifecycle state this node is in (rclpy keeps it private)
        self.log_failures = True      # off while autostart runs: main() prints the one line itself

        # Publishers, the query subscription and the reset service exist in every state, so that a
        # question asked of an inactive node still gets its refusal.
        self._answer_pub = self.create_publisher(String, "~/answer", _RELIABLE)
        self._stream_pub = self.create_publisher(String, "~/answer_stream", QoSProfile(
            depth=100, reliability=QoSReliabilityPolicy.RELIABLE))
        self._info_pub = self.create_publisher(String, "~/answer_info", QoSProfile(
            depth=QUERY_HISTORY, reliability=QoSReliabilityPolicy.RELIABLE))
        self._stats_pub = self.create_publisher(String, "~/stats", _RELIABLE)
        # Raw: rclpy would decode invalid UTF-8 into U+FFFD without telling (see queries.decode_string_cdr).
        self.create_subscription(String, "~/query", self._on_query, QoSProfile(
            depth=QUERY_HISTORY, reliability=QoSReliabilityPolicy.RELIABLE),
            callback_group=MutuallyExclusiveCallbackGroup(), raw=True)  # one at a time: answers keep query order
        self.create_service(Trigger, "~/reset", self._on_reset, callback_group=MutuallyExclusiveCallbackGroup())
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self._stats_timer = self.create_timer(self.settings["stats_period_s"], self._publish_stats,
                                              callback_group=self._timer_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)

    def destroy_node(self) -> None:
        self._gc_pauses.remove()
        super().destroy_node()

    @property
    def active(self) -> bool:
        return self._worker is not None

    # ---- lifecycle ------------------------------------------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self.settings = current_parameters(self)
            torch.set_num_threads(torch_threads(self.settings["torch_threads"]))
            cameras = [self.resolve_topic_name(topic) for topic in
                        self.settings["image_topics"] + self.settings["compressed_image_topics"]]
            self._sessions = CameraSessions(SessionConfig(**session_settings(self.settings)), cameras)
        except (ParameterError, ModelLoadError, ValueError, OSError, RuntimeError) as error:
            return self._fail("configure", error)
        self._gate = FeedGate(self.settings["frame_rate_hz"])
        with self._gc_pauses.deliberate():
            frozen = freeze_loaded_heap()   # collections then skip the model's objects (gc_pauses.py)
        self._gc_pauses.frozen_objects = frozen
        config, frame_tokens = self._sessions.config, self._sessions.frame_tokens
        self.get_logger().info(
            f"configured: model {self._sessions.family} from {self.settings['model_path'] or 'the embedded model'} "
            f"on {config.device} ({config.dtype}, quantization {config.quantization}, {torch.get_num_threads()} "
            f"torch threads); cache policy "
            f"{config.cache_policy}, budget {config.cache_budget} tokens ({config.cache_budget / frame_tokens:.0f} "
            f"frames of {frame_tokens} tokens at 640x480), recent window {config.recent_window}, eviction chunk "
            f"{config.eviction_chunk}; recall "
            + (f"{config.recall_store_mb:g} MB, {config.recall_frames} frames per answer; " if config.recall_on
               else "off; ")
            + f"one cache per camera ({len(self._sessions.sessions)}), questions default to {self._sessions.default_camera}; "
            f"{frozen:,} loaded Python objects exempted from garbage collection")
        self.last_failure = ""
        self.state = "inactive"
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._queue = RequestQueue(self.settings["query_queue_size"])
        worker = SessionWorker(self._sessions, self._queue, self.stats, self.settings, self._publish_piece,
                               self._publish_reply, self._report, gc_pauses=self._gc_pauses)
        try:
            self._subscribe_cameras()
        except Exception as error:  # a topic name ROS refuses, typically
            self._unsubscribe_cameras()
            return self._fail("activate", error)
        worker.start()
        self._worker = worker
        self.state = "active"
        self.get_logger().info(f"active: watching {sorted(self._cameras)}; questions on "
                               f"{self.resolve_topic_name('~/query')}")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker(INACTIVE, cancel=False)   # the answer in hand finishes; the cache stays whole
        self.state = "inactive"
        self.get_logger().info("inactive: cameras unsubscribed, questions refused; the cache is kept")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._free_sessions()
        self.state = "unconfigured"
        self.get_logger().info("unconfigured: model and cache freed")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker(SHUTDOWN, cancel=True)
        self._free_sessions()
        self.state = "finalized"
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker(SHUTDOWN, cancel=True)
        self._free_sessions()
        self.state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS   # back to unconfigured: configure may be retried

    def _fail(self, transition: str, error: Exception) -> TransitionCallbackReturn:
        hint = ""
        if isinstance(error, ModelLoadError) and str(embedded_model_path()) in str(error):
            hint = (" (the embedded model is not in this install: train it with "
                    "`python -m infmllm_ros.tiny_model.train`, or set model_path)")
        self.last_failure = f"{transition} failed: {error}{hint}"
        if self.log_failures:
            self.get_logger().error(self.last_failure)
        self._sessions = None
        return TransitionCallbackReturn.FAILURE

    def _subscribe_cameras(self) -> None:
        camera_qos = qos_profile_sensor_data if self.settings["image_qos"] == "sensor_data" else QoSProfile(
            depth=5, reliability=QoSReliabilityPolicy.RELIABLE)
        for topics, msg_type, convert in ((self.settings["image_topics"], Image, image_to_rgb),
                                          (self.settings["compressed_image_topics"], CompressedImage,
                                           compressed_to_rgb)):
            for topic in topics:
                camera = self.resolve_topic_name(topic)  # remappings applied: the name stats report
                self._cameras[camera] = self.create_subscription(
                    msg_type, topic, partial(self._on_image, camera, convert), camera_qos,
                    callback_group=self._camera_group)
                self.stats.add_camera(camera)

    def _unsubscribe_cameras(self) -> None:
        for subscription in self._cameras.values():
            self.destroy_subscription(subscription)
        self._cameras = {}

    def _stop_worker(self, code: str, cancel: bool) -> bool:
        self._unsubscribe_cameras()
        worker, self._worker = self._worker, None
        if worker is None:
            return True
        if worker.stop(code, cancel=cancel):
            return True
        # Not the node's logger: after SIGINT its context (and /rosout) is gone.
        get_logger(NODE_NAME).warning(f"the model did not stop within {STOP_JOIN_S:.0f} s")
        return False

    def _free_sessions(self) -> None:
        device = self._sessions.config.device if self._sessions is not None else None
        self._sessions = None
        with self._gc_pauses.deliberate():
            unfreeze_heap()   # the model's objects were frozen at configure: let the collector free them
            release_memory(device)
        self._gc_pauses.frozen_objects = 0
        self.stats.set_engine(cache_tokens=0, cache_bytes=0, frames_seen=0)

    # ---- parameters ----------------------------------------------------------------------------

    def _on_set_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        updates = {}
        for parameter in parameters:
            spec = BY_NAME.get(parameter.name)
            if spec is None:
                continue  # rclpy's own (use_sim_time, ...)
            try:
                updates[parameter.name] = check(parameter.name, parameter.value)
            except ParameterError as error:
                return SetParametersResult(successful=False, reason=str(error))
            if spec.read_only and self._sessions is not None:
                return SetParametersResult(successful=False, reason=(
                    f"{parameter.name} is read at configure: clean the node up first (lifecycle cleanup), "
                    "set it, then configure and activate again"))
        self.settings.update(updates)
        if "query_queue_size" in updates and self._queue is not None:
            self._queue.max_queries = updates["query_queue_size"]
        if "frame_rate_hz" in updates:
            self._gate.rate_hz = updates["frame_rate_hz"]
        if "stats_period_s" in updates:
            self.destroy_timer(self._stats_timer)
            self._stats_timer = self.create_timer(updates["stats_period_s"], self._publish_stats,
                                                  callback_group=self._timer_group)
        return SetParametersResult(successful=True)

    # ---- callbacks: decode, check, queue; never the model --------------------------------------

    def _on_image(self, camera: str, convert, msg) -> None:
        started = time.monotonic()
        try:
            self._take_image(camera, convert, msg)
        finally:  # how long the executor was held: a long callback delays every other one
            self.stats.add_latency("image_callback", time.monotonic() - started)

    def _take_image(self, camera: str, convert, msg) -> None:
        self.stats.count_frame(camera, "received")
        stamp = stamp_seconds(msg) or time.time()
        # Before decoding, so a 30 Hz camera costs one decode per fed frame; a frame skipped here is
        # not looked at (counted skipped, even if it was malformed). A bad frame does not take the slot.
        if not self._gate.due(camera, stamp):
            self.stats.count_frame(camera, "skipped")
            return
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
        self._gate.commit(camera, stamp)
        queue = self._queue
        if queue is not None and queue.put_frame(camera, Frame(rgb, stamp, time.monotonic())):
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
            query_id = self._query_ids() if rejected.query_id is None else rejected.query_id
            self._refuse(query_id, rejected.question, rejected.reason, rejected.kind)
            return
        except Exception as error:
            self._bad_input(f"query.{MALFORMED}", f"{type(error).__name__}: {error}")
            self._refuse(self._query_ids(), "", f"malformed query: {error}", MALFORMED)
            return
        if query.camera is not None and not query.camera.startswith("/"):
            query = replace(query, camera=self._camera_name(query.camera))
        queue = self._queue
        if queue is None or not self.active:
            self.stats.count_query(INACTIVE)
            failure = f" ({self.last_failure})" if self.last_failure else ""
            self._refuse(query.id, query.question, f"inactive: the node is {self.state}{failure}; activate it "
                                                   "(lifecycle) to get answers", INACTIVE)
        elif not queue.put_query(query):
            self.stats.count_query(BUSY)
            self._refuse(query.id, query.question, f"busy: {queue.max_queries} questions are already "
                                                   "waiting (query_queue_size); ask again later", BUSY)

    def _camera_name(self, topic: str) -> str:
        """A camera named relative to the node's namespace, as the stats name it (unresolvable names
        are kept, and refused as unknown by the worker)."""
        try:
            return self.resolve_topic_name(topic)
        except Exception:
            return topic

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        """Empty the cache and the conversation, keep the model: the robot entered a new room.

        Queued behind what came before it, so an answer in progress and the questions asked before
        the reset are answered about the old history, and frames after it are the only history.
        """
        sessions, queue = self._sessions, self._queue
        if sessions is None:
            response.success, response.message = False, "not configured: there is no cache to reset"
            return response
        if self.active and queue is not None:
            reset = ResetRequest()
            if not queue.put_reset(reset) or not reset.done.wait(RESET_WAIT_S):
                response.success, response.message = False, f"the worker did not reach the reset in {RESET_WAIT_S:.0f} s"
                return response
            forgotten = reset.frames_forgotten
        else:  # inactive: no worker owns the sessions now
            forgotten = sessions.reset()
            self.stats.count_reset()
            self.stats.set_engine(cache_tokens=0, cache_bytes=0, frames_seen=0)
        self._gate.forget()
        response.success, response.message = True, f"cache and conversation cleared ({forgotten} frames forgotten)"
        self.get_logger().info(response.message)
        return response

    def _publish_stats(self) -> None:
        queue = self._queue
        snapshot = self.stats.snapshot(stamp=time.time(), queued_queries=queue.pending_queries if queue else 0,
                                       state=self.state, last_failure=self.last_failure,
                                       gc_pauses=self._gc_pauses.summary())
        self._publish(self._stats_pub, json.dumps(snapshot))

    # ---- replies --------------------------------------------------------------------------------

    def _refuse(self, query_id: Any, question: str, reason: str, code: str) -> None:
        self.stats.count_query("refused")
        self._publish_reply(info_message(query_id, question, "refused", reason, refusal=code,
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
        except Exception:  # the context went down under us: nothing left to tell
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
        """Stop the worker (cancelling an answer at its next token, refusing what waits) and free the
        model; False if the worker is still running."""
        joined = self._stop_worker(SHUTDOWN, cancel=True)
        self._sessions = None
        try:  # the refusals just published must reach their readers before the node goes away
            if self._info_pub.get_subscription_count():
                self._info_pub.wait_for_all_acked(Duration(seconds=REPLY_FLUSH_S))
        except Exception:  # the context is already down: nothing more can be sent
            pass
        return joined


def autostart(node: InfMLLMNode) -> bool:
    """Configure and activate; False (with node.last_failure set) if a transition failed."""
    node.log_failures = False
    try:
        return (node.trigger_configure() == TransitionCallbackReturn.SUCCESS
                and node.trigger_activate() == TransitionCallbackReturn.SUCCESS)
    finally:
        node.log_failures = True


def _spin(executor) -> None:
    try:
        executor.spin()
    except (ExternalShutdownException, ShutdownException):
        pass


def main(args: list[str] | None = None) -> int:
    """Console entry `infmllm_node`: run until SIGINT; exit 2 with one error line on bad settings."""
    # Our own SIGINT/SIGTERM handling, not rclpy's: rclpy's would shut the context down first, and
    # the questions still waiting could no longer be told "shutdown".
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = InfMLLMNode()
        if node.get_parameter("autostart").value and not autostart(node):
            raise ParameterError(node.last_failure)
    except (ParameterError, ParameterException, ValueError) as error:
        hint = " (a double needs a decimal point, e.g. 2.0)" if "PARAMETER_DOUBLE" in str(error) else ""
        print(f"{NODE_NAME}: error: {error}{hint}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    except KeyboardInterrupt:  # SIGINT while the model was loading
        rclpy.try_shutdown()
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):   # Ctrl-C, and what launch sends to stop a node
        signal.signal(signum, lambda *_: stop.set())
    # Not rclpy's MultiThreadedExecutor: before rclpy 10.0.4 it hands a callback to its pool and, until
    # a pool thread has started it, hands it over again on every pass without waiting (rclpy issue
    # 1452, fixed by pull 1547). At 30 camera messages a second its spin thread then ran a core flat
    # out and held the GIL: measured on Kilted's rclpy 9.1.2, the node received 38 % of the frames and
    # its answers' p95 was 100x the engine's. The node's callbacks are short (the module docstring).
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    # The executor spins on a thread of its own and the main thread waits in Python, where a signal
    # handler runs at once: with rclpy's handler off, nothing would wake an executor blocked in its
    # wait set (measured: a spinning node ignored SIGINT for as long as we waited).
    spinner = threading.Thread(target=_spin, args=(executor,), name="executor", daemon=True)
    spinner.start()
    while not stop.wait(0.5) and spinner.is_alive():
        pass
    # A repeated Ctrl-C must not land in the middle of joining the worker: ignore it while closing.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    joined = node.close()   # waiting questions get "shutdown" while the context still works
    executor.shutdown()
    # Wait for the spin thread to leave rclpy: a daemon thread that wakes in C++ after the interpreter
    # has begun to exit aborts the process ("terminate called without an active exception", exit
    # -6: seen once in CI on SIGINT mid-answer).
    spinner.join(STOP_JOIN_S)
    joined = joined and not spinner.is_alive()
    node.destroy_node()
    rclpy.try_shutdown()
    if not joined:  # a forward (or a callback) longer than STOP_JOIN_S: leave now rather than abort at exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
