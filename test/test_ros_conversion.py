"""The node's plain-Python parts, without DDS: image conversion, query parsing, the work queue,
stats, parameter checks, and the small pure pieces of run/replay/demo."""

from __future__ import annotations

import array
import io
import json
import struct
import threading

import numpy as np
import pytest
from PIL import Image as PILImage

from infmllm_ros.ros import image_conversion as conversion
from infmllm_ros.ros import parameters, queries, stats
from infmllm_ros.ros.image_conversion import ImageConversionError, compressed_to_rgb, image_to_rgb, stamp_seconds
from infmllm_ros.ros.mailbox import RequestQueue
from infmllm_ros.ros.queries import Query, QueryIds, QueryRejected, decode_string_cdr, parse_query

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (7, 5, 3), dtype=np.uint8)  # odd sizes catch row/column mix-ups


def raw_message(rgb: np.ndarray, encoding: str, pad: int = 0, data_type=bytes):
    from sensor_msgs.msg import Image
    alpha = np.full(rgb.shape[:2] + (1,), 200, np.uint8)
    pixels = {"rgb8": rgb, "bgr8": rgb[..., ::-1], "rgba8": np.concatenate([rgb, alpha], -1),
              "bgra8": np.concatenate([rgb[..., ::-1], alpha], -1), "mono8": rgb[..., :1]}[encoding]
    height, width, channels = pixels.shape
    rows = np.zeros((height, width * channels + pad), np.uint8)
    rows[:, :width * channels] = pixels.reshape(height, -1)
    msg = Image(height=height, width=width, encoding=encoding, step=width * channels + pad)
    msg.data = rows.tobytes()
    if data_type is not bytes:  # what other producers hand us: array.array (rclpy), numpy (rosbags)
        msg = _Plain(height=height, width=width, encoding=encoding, step=width * channels + pad,
                     data=data_type(rows.tobytes()))
    return msg


class _Plain:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def encoded(rgb: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    PILImage.fromarray(rgb).save(buffer, format=fmt)
    return buffer.getvalue()


# ---- raw images -----------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
@pytest.mark.parametrize("pad", [0, 3])
def test_colour_encodings_round_trip(encoding, pad):
    out = image_to_rgb(raw_message(RGB, encoding, pad))
    assert out.dtype == np.uint8 and out.shape == (7, 5, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, RGB)


def test_mono8_becomes_grey_rgb():
    out = image_to_rgb(raw_message(RGB, "mono8", pad=1))
    np.testing.assert_array_equal(out, np.repeat(RGB[..., :1], 3, axis=-1))


@pytest.mark.parametrize("data_type", [lambda b: array.array("B", b), lambda b: np.frombuffer(b, np.uint8), list])
def test_any_buffer_type_for_data(data_type):
    np.testing.assert_array_equal(image_to_rgb(raw_message(RGB, "bgr8", data_type=data_type)), RGB)


def test_rclpy_message_data_is_read_without_a_copy_per_pixel():
    msg = raw_message(RGB, "rgb8")
    assert isinstance(msg.data, array.array)  # what rclpy stores for uint8[]
    np.testing.assert_array_equal(image_to_rgb(msg), RGB)


def test_rosbags_messages_convert_too():
    from rosbags.typesys import Stores, get_typestore
    types = get_typestore(Stores.ROS2_KILTED).types
    header = types["std_msgs/msg/Header"](stamp=types["builtin_interfaces/msg/Time"](sec=3, nanosec=500_000_000),
                                          frame_id="cam")
    msg = types["sensor_msgs/msg/Image"](header=header, height=7, width=5, encoding="rgb8", is_bigendian=0, step=15,
                                         data=RGB.reshape(-1).copy())
    np.testing.assert_array_equal(image_to_rgb(msg), RGB)
    assert stamp_seconds(msg) == 3.5


def test_output_does_not_alias_the_message():
    msg = raw_message(RGB, "rgb8")
    out = image_to_rgb(msg)
    out[:] = 0
    np.testing.assert_array_equal(image_to_rgb(msg), RGB)


@pytest.mark.parametrize("change, kind", [
    (dict(height=0, width=0, step=0, data=b""), conversion.EMPTY),
    (dict(height=7, width=0), conversion.EMPTY),
    (dict(step=14), conversion.BAD_LAYOUT),                  # less than width * 3
    (dict(data=bytes(7 * 15 - 1)), conversion.BAD_LAYOUT),   # one byte short
    (dict(data=bytes(7 * 15 + 5)), conversion.BAD_LAYOUT),   # trailing bytes
    (dict(encoding="yuv422"), conversion.UNKNOWN_ENCODING),
    (dict(encoding="RGB8"), conversion.UNKNOWN_ENCODING),    # encodings are case-sensitive in ROS
    (dict(height=5000, width=5000, step=15000), conversion.TOO_LARGE),  # refused before data is looked at
])
def test_bad_raw_images_raise_one_error_type_with_a_kind(change, kind):
    msg = raw_message(RGB, "rgb8")
    for name, value in change.items():
        setattr(msg, name, value)
    if kind == conversion.UNKNOWN_ENCODING and conversion._BRIDGE is not None:
        pytest.skip("cv_bridge is importable and converts more encodings")
    with pytest.raises(ImageConversionError) as caught:
        image_to_rgb(msg, max_pixels=1_000_000)
    assert caught.value.kind == kind and str(caught.value)


def test_max_pixels_is_configurable():
    image_to_rgb(raw_message(RGB, "rgb8"), max_pixels=35)
    with pytest.raises(ImageConversionError) as caught:
        image_to_rgb(raw_message(RGB, "rgb8"), max_pixels=34)
    assert caught.value.kind == conversion.TOO_LARGE and "max_image_pixels" in str(caught.value)


# ---- compressed images ---------------------------------------------------------------------------

def compressed(data: bytes, fmt: str = "jpeg"):
    from sensor_msgs.msg import CompressedImage
    return CompressedImage(format=fmt, data=data)


def test_png_round_trips_exactly_and_jpeg_closely():
    smooth = np.stack(np.meshgrid(np.arange(64), np.arange(48)), -1).astype(np.uint8) * 3
    smooth = np.concatenate([smooth, smooth[..., :1]], -1)
    np.testing.assert_array_equal(compressed_to_rgb(compressed(encoded(smooth, "PNG"), "png")), smooth)
    jpeg = compressed_to_rgb(compressed(encoded(smooth, "JPEG")))
    assert jpeg.shape == smooth.shape and np.abs(jpeg.astype(int) - smooth).mean() < 3


def test_grey_and_rgba_png_become_rgb():
    grey = PILImage.fromarray(RGB[..., 0])
    buffer = io.BytesIO()
    grey.save(buffer, format="PNG")
    out = compressed_to_rgb(compressed(buffer.getvalue(), "png"))
    np.testing.assert_array_equal(out, np.repeat(RGB[..., :1], 3, -1))
    rgba = np.concatenate([RGB, np.full((7, 5, 1), 9, np.uint8)], -1)
    np.testing.assert_array_equal(compressed_to_rgb(compressed(encoded(rgba, "PNG"), "png")), RGB)


def test_the_demo_bag_format_decodes():
    """The demo bag writes OpenCV JPEGs with format 'jpeg'; rclpy hands data over as array.array."""
    import cv2
    smooth = np.full((48, 64, 3), (200, 30, 90), np.uint8)
    ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(smooth, cv2.COLOR_RGB2BGR))
    msg = compressed(jpeg.tobytes())
    assert isinstance(msg.data, array.array)
    assert np.abs(compressed_to_rgb(msg).astype(int) - smooth).max() < 8


@pytest.mark.parametrize("data, fmt, kind", [
    (b"", "jpeg", conversion.EMPTY),
    (b"\xff\xd8\xff\xe0 definitely not a jpeg", "jpeg", conversion.CORRUPT),
    (bytes(range(256)), "png", conversion.CORRUPT),
    (encoded(RGB, "BMP"), "bmp", conversion.CORRUPT),  # only JPEG and PNG are accepted
    (encoded(RGB, "PNG"), "16UC1; compressedDepth", conversion.UNKNOWN_ENCODING),
])
def test_bad_compressed_images(data, fmt, kind):
    with pytest.raises(ImageConversionError) as caught:
        compressed_to_rgb(compressed(data, fmt))
    assert caught.value.kind == kind


def test_truncated_jpeg_is_corrupt_not_half_grey():
    jpeg = encoded(RNG.integers(0, 256, (120, 160, 3), dtype=np.uint8), "JPEG")
    with pytest.raises(ImageConversionError) as caught:
        compressed_to_rgb(compressed(jpeg[:len(jpeg) // 2]))
    assert caught.value.kind == conversion.CORRUPT


def test_huge_compressed_image_is_refused_from_its_header():
    buffer = io.BytesIO()
    PILImage.new("L", (20000, 20000)).save(buffer, format="PNG")  # 400 Mpx, a few hundred kB
    with pytest.raises(ImageConversionError) as caught:
        compressed_to_rgb(compressed(buffer.getvalue(), "png"), max_pixels=1_000_000)
    assert caught.value.kind == conversion.TOO_LARGE


def test_stamp_seconds():
    from sensor_msgs.msg import Image
    msg = Image()
    msg.header.stamp.sec, msg.header.stamp.nanosec = 12, 250_000_000
    assert stamp_seconds(msg) == 12.25 and stamp_seconds(object()) == 0.0


# ---- queries --------------------------------------------------------------------------------------

def test_plain_text_gets_generated_unique_ids():
    ids = QueryIds()
    first, second = parse_query("  what is in view?\n", ids), parse_query("and now?", ids)
    assert first.question == "what is in view?" and first.id != second.id and first.id.startswith("auto-")


@pytest.mark.parametrize("query_id", ["q-7", 7])
def test_json_queries_keep_their_id(query_id):
    query = parse_query(json.dumps({"id": query_id, "question": "how many objects are in view?"}), QueryIds())
    assert query.id == query_id and type(query.id) is type(query_id), "an id comes back with its JSON type"
    assert query.question == "how many objects are in view?"


def test_json_query_may_name_its_camera():
    assert parse_query('{"id": 1, "question": "what is in view?", "camera": "/left/image"}', QueryIds()).camera \
        == "/left/image"
    assert parse_query("what is in view?", QueryIds()).camera is None
    with pytest.raises(QueryRejected) as caught:
        parse_query('{"id": "c", "question": "what?", "camera": 3}', QueryIds())
    assert caught.value.kind == queries.BAD_JSON and caught.value.query_id == "c"


def test_json_without_id_gets_one():
    assert parse_query('{"question": "what colour?"}', QueryIds()).id.startswith("auto-")


@pytest.mark.parametrize("text, kind, keeps_id", [
    ("", queries.EMPTY, False),
    (" \t\n", queries.EMPTY, False),
    ('{"id": "a", "question": "  "}', queries.EMPTY, True),
    ("x" * 2001, queries.TOO_LONG, False),
    ("x" * 1_000_000, queries.TOO_LONG, False),
    (json.dumps({"id": "a", "question": "y" * 2001}), queries.TOO_LONG, True),
    (json.dumps({"id": "a", "question": "y" * 1_000_000}), queries.TOO_LONG, True),  # id read, body not parsed
    ('{"id": "a", "question": ', queries.BAD_JSON, False),
    ('{"id": "a"}', queries.BAD_JSON, True),
    ('{"id": "a", "question": 5}', queries.BAD_JSON, True),
    ('{"id": true, "question": "q"}', queries.BAD_JSON, False),
    ('{"id": [1], "question": "q"}', queries.BAD_JSON, False),
    (json.dumps({"id": "i" * 201, "question": "q"}), queries.BAD_JSON, False),
    ('{"a": 1} trailing', queries.BAD_JSON, False),
])
def test_bad_queries_are_refused_with_a_reason(text, kind, keeps_id):
    with pytest.raises(QueryRejected) as caught:
        parse_query(text, QueryIds(), max_chars=2000)
    rejected = caught.value
    assert rejected.kind == kind and rejected.reason
    assert (rejected.query_id == "a") == keeps_id
    assert len(rejected.question) <= queries.ECHO_CHARS + 3


def test_max_chars_is_configurable():
    assert parse_query("x" * 10, QueryIds(), max_chars=10).question == "x" * 10
    with pytest.raises(QueryRejected):
        parse_query("x" * 11, QueryIds(), max_chars=10)


def test_rclpy_hides_invalid_utf8_so_the_node_decodes_raw_bytes():
    """What rclpy does with invalid UTF-8 in a String: replaces it, silently. Hence decode_string_cdr."""
    from rclpy.serialization import deserialize_message, serialize_message
    from std_msgs.msg import String
    bad = b"\x00\x01\x00\x00" + struct.pack("<I", 4) + b"a\xff\xfe\x00"
    assert "\ufffd" in deserialize_message(bad, String).data
    with pytest.raises(QueryRejected) as caught:
        decode_string_cdr(bad)
    assert caught.value.kind == queries.NOT_UTF8 and "UTF-8" in caught.value.reason
    for text in ("what is in view?", "wie viele Würfel? 立方体", ""):
        assert decode_string_cdr(serialize_message(String(data=text))) == text


def test_string_cdr_big_endian_malformed_and_unknown():
    assert decode_string_cdr(b"\x00\x00\x00\x00" + struct.pack(">I", 3) + b"hi\x00") == "hi"
    for broken in (b"\x00\x01\x00\x00\x05", b"\x00\x01\x00\x00" + struct.pack("<I", 99) + b"hi\x00",
                   b"\x00\x01\x00\x00" + struct.pack("<I", 0)):
        with pytest.raises(QueryRejected) as caught:
            decode_string_cdr(broken)
        assert caught.value.kind == queries.MALFORMED
    assert decode_string_cdr(b"\x00\x03\x00\x00whatever") is None  # parameter-list CDR: left to rclpy


# ---- the work queue -------------------------------------------------------------------------------

def test_queue_bounds_queries_not_frames():
    queue = RequestQueue(max_queries=2)
    assert queue.put_query(Query("1", "a")) and queue.put_query(Query("2", "b"))
    assert not queue.put_query(Query("3", "c")), "full: refused (the caller answers busy), never dropped"
    assert queue.put_frame("cam", "f1") is False, "frames are not bounded by the query limit"
    assert queue.pending_queries == 2
    queue.get(0)
    assert queue.pending_queries == 1 and queue.put_query(Query("3", "c"))
    queue.max_queries = 5  # a parameter change applies at once
    assert queue.put_query(Query("4", "d"))


def test_queue_order_exactly():
    queue = RequestQueue(max_queries=5)
    a, b = Query("a", "qa"), Query("b", "qb")
    queue.put_query(a)
    queue.put_frame("cam", "f1")
    queue.put_query(b)
    items = [queue.get(0) for _ in range(3)]
    assert items == [("query", None, a), ("frame", "cam", "f1"), ("query", None, b)]


def test_close_returns_waiting_queries_and_wakes_the_worker():
    queue = RequestQueue(max_queries=5)
    queue.put_query(Query("a", "qa"))
    got = []
    empty = RequestQueue(max_queries=1)
    waiter = threading.Thread(target=lambda: got.append(empty.get(timeout=10)))
    waiter.start()
    empty.close()
    waiter.join(2)
    assert not waiter.is_alive() and got == [None]
    assert [(kind, q.id) for kind, q in queue.close()] == [("query", "a")] and not queue.put_query(Query("b", "qb"))


# ---- stats --------------------------------------------------------------------------------------

def test_percentiles_nearest_rank():
    values = list(range(1, 101))
    assert stats.percentile(values, 50) == 50 and stats.percentile(values, 95) == 95
    assert stats.percentile([], 50) is None and stats.percentile([3.0], 95) == 3.0


def test_snapshot_is_json_with_every_counter():
    node_stats = stats.NodeStats()
    node_stats.add_camera("/cam")
    node_stats.count_frame("/cam", "received", 3)
    node_stats.count_frame("/cam", "fed")
    node_stats.count_bad("image.corrupt")
    node_stats.count_query("answered")
    node_stats.add_latency("answer", 0.25)
    node_stats.add_latency("answer", 0.5)
    node_stats.set_engine(cache_tokens=10, cache_bytes=2**20)
    snapshot = json.loads(json.dumps(node_stats.snapshot(stamp=1.0)))
    assert snapshot["cameras"]["/cam"] == {"received": 3, "skipped": 0, "dropped": 0, "bad": 0, "failed": 0,
                                           "fed": 1}
    assert snapshot["bad_input"] == {"image.corrupt": 1} and snapshot["queries"]["answered"] == 1
    assert snapshot["latency"]["answer"] == {"p50_ms": 250.0, "p95_ms": 500.0, "p99_ms": 500.0,
                                           "max_ms": 500.0, "count": 2}
    assert snapshot["cache_mb"] == 1.0 and snapshot["stamp"] == 1.0


def test_throttled_report_once_per_kind_per_period():
    report = stats.ThrottledReport(period_s=10)
    assert report.due("a", now=0) == 0 and report.due("b", now=0) == 0
    assert report.due("a", now=1) is None and report.due("a", now=2) is None
    assert report.due("a", now=11) == 2


# ---- parameters -----------------------------------------------------------------------------------

def test_defaults_pass_and_match_the_engine():
    from infmllm_ros.engine.loading import DTYPES
    from infmllm_ros.engine.policies import POLICIES
    from infmllm_ros.engine.quantization import MODES
    from infmllm_ros.engine.session import DEFAULT_RECALL_STORE_MB, PRUNE_UNITS, RECALL_AUTO, SessionConfig
    checked = parameters.check_all(parameters.defaults())
    assert (parameters.RECALL_AUTO, parameters.DEFAULT_RECALL_STORE_MB) == (RECALL_AUTO, DEFAULT_RECALL_STORE_MB)
    assert set(parameters.DTYPES) == set(DTYPES) and set(parameters.CACHE_POLICIES) == set(POLICIES)
    assert set(parameters.QUANTIZATION) == {*MODES, "auto"}
    assert set(parameters.PRUNE_UNITS) == set(PRUNE_UNITS)
    import dataclasses
    assert set(parameters.SESSION_FIELDS) == {f.name for f in dataclasses.fields(SessionConfig)}, \
        "every SessionConfig knob is a node parameter of the same name"
    config = SessionConfig(**parameters.session_settings(checked))
    assert config == SessionConfig(), "the node's defaults are the engine's defaults"


@pytest.mark.parametrize("name, value, message", [
    ("model_path", "/no/such/dir", "not a directory"),
    ("device", "gpu", "cuda"),
    ("dtype", "float64", "one of"),
    ("quantization", "4bit", "not yet supported"),
    ("quantization", "gptq", "not yet supported"),
    ("quantization", "bogus", "'cpu-int8'"),
    ("cache_policy", "lru", "one of"),
    ("cache_budget", -1, "in ["),
    ("attention_bias", 1.5, "in ["),
    ("frame_rate_hz", 0.0, "in ("),
    ("max_new_tokens", 0, "in ["),
    ("query_queue_size", -1, "in ["),
    ("image_topics", ["/a b"], "not a valid topic"),
    ("image_topics", ["/a", "/a"], "twice"),
    ("image_qos", "best_effort", "one of"),
    ("stats_period_s", "1", "expected double"),
    ("cache_budget", True, "expected integer"),
    ("recall_store_mb", -2.0, "-1 (auto)"),
])
def test_each_validator_refuses_with_the_name(name, value, message):
    with pytest.raises(parameters.ParameterError) as caught:
        parameters.check(name, value)
    assert str(caught.value).startswith(name) and message in str(caught.value)


def test_check_normalises_and_cross_checks():
    assert parameters.check("frame_rate_hz", 2) == 2.0 and parameters.check("compressed_image_topics", None) == []
    with pytest.raises(parameters.ParameterError, match="no camera"):
        parameters.check_all({"image_topics": [], "compressed_image_topics": []})
    with pytest.raises(parameters.ParameterError, match="both"):
        parameters.check_all({"image_topics": ["/c"], "compressed_image_topics": ["/c"]})
    # recall asked of a policy that evicts nothing is refused; its auto default is not
    with pytest.raises(parameters.ParameterError, match="full evicts none"):
        parameters.check_all({"cache_policy": "full", "recall_store_mb": 8.0})
    assert parameters.check_all({"cache_policy": "full"})["recall_store_mb"] == parameters.RECALL_AUTO


def test_model_and_topic_parameters_are_read_only():
    writable = {spec.name for spec in parameters.PARAMETERS if not spec.read_only}
    assert writable == {"frame_rate_hz", "max_new_tokens", "query_queue_size", "max_query_chars",
                        "max_image_pixels", "slow_work_factor", "stats_period_s"}


# ---- run / replay / demo pieces ------------------------------------------------------------------

def test_run_refuses_unknown_yaml_keys(tmp_path, repo_root):
    from infmllm_ros.ros import run
    assert run.unknown_keys(repo_root / "config" / "infmllm.yaml") == []
    typo = tmp_path / "typo.yaml"
    typo.write_text("infmllm_node:\n  ros__parameters:\n    cache_budegt: 10\n    frame_rate_hz: 2.0\n")
    assert run.unknown_keys(typo) == ["cache_budegt"]
    assert run.main(["--params", str(typo)]) == 2
    assert run.node_arguments(typo, ["-p", "a:=1"]) == ["infmllm_node", "--ros-args", "--params-file", str(typo),
                                                         "-p", "a:=1"]


def test_replay_remaps():
    from infmllm_ros.ros.replay import parse_remaps
    assert parse_remaps(["/a:=/b", "/c:=/d/e"]) == {"/a": "/b", "/c": "/d/e"}
    with pytest.raises(ValueError):
        parse_remaps(["/a=/b"])


def test_demo_scoring():
    from infmllm_ros.ros.demo import is_correct, summary_line
    assert is_correct(" Blue  Square.", "blue square") and not is_correct("blue", "blue square")
    questions = [{"id": "a", "family": "current"}, {"id": "b", "family": "long"}]
    infos = {"a": {"status": "ok", "latency_ms": 10.0}, "b": {"status": "refused", "latency_ms": None}}
    line = summary_line(questions, infos, {"a"})
    assert "1/2 = 50.0%" in line and "current 1/1" in line and "p50 10 ms" in line
