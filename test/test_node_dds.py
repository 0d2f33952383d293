"""infmllm_node over real DDS, in its own process: a replayed bag, questions from another node, bad
input of every kind, floods, parameter changes, a long answer, SIGINT and a missing model.

One node process serves most tests (module scope; the model loads once); the never-stopping
"babbling" model runs in a second node under its own namespace for the long-answer and SIGINT tests.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
from PIL import Image as PILImage

from node_helpers import (EMBEDDED, REPO_ROOT, NodeListener, NodeProcess, babbling_model_dir,  # noqa: F401
                          module_ros_environ, node_model_dir, rgb_image_msg, run_module, wait_until)
from infmllm_ros.ros.parameters import PARAMETERS

BAG_DURATION_S = 60.0        # 20 questions, 8 of them about the current scene
REPLAY_RATE = 4.0            # the bag plays 4x faster than it was recorded
FEED_RATE_HZ = 1.0           # frames per second of stamp (bag) time, as the model was trained: at any REPLAY_RATE
FRAME_PERIOD_S = 1.05        # wall time between test frames stamped now, so that each one is due
RAW_CAMERA = "/test/cam_raw"
COMPRESSED_CAMERA = "/camera/image_raw/compressed"  # the demo bag's camera topic
MAX_PIXELS = 1_000_000
QUEUE_SIZE = 8
# Embedded model only (a random model only has to answer or refuse). The engine alone gets 53 % of
# fixed current-scene questions (test_embedded_model) and chance is about 30 %; through the node the
# frame sampling depends on timing, so 8 questions here swing by one or two answers (4/8 measured).
# 0.25 guards against a node that feeds the model no usable frames (its answers then collapse to
# one prior per question kind), without flaking on the model's own weakness; the precise accuracy
# checks are the deterministic engine-level tests.
CURRENT_SCENE_FLOOR = 0.25
BABBLE_NODE = "/babble/infmllm_node"
BABBLE_CAMERA = "/babble/cam_raw"


def normalise(text: str) -> str:
    return " ".join(text.lower().strip().rstrip(".!?").split())


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_bag_job(tmp_path_factory, module_ros_environ):
    """Start writing a short demo bag (it renders while the node loads); wait with finished()."""
    out = tmp_path_factory.mktemp("bag") / "demo"
    process = subprocess.Popen([sys.executable, "-m", "infmllm_ros.synthetic.demo_bag", "--out", str(out),
                                "--duration", str(BAG_DURATION_S)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    yield process, out
    if process.poll() is None:
        process.kill()
        process.wait()


def finished(job):
    process, out = job
    _, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr
    return out


@pytest.fixture(scope="module")
def node(module_ros_environ, node_model_dir, demo_bag_job):
    process = NodeProcess(module_ros_environ, {
        "model_path": str(node_model_dir), "image_topics": [RAW_CAMERA], "compressed_image_topics": [COMPRESSED_CAMERA],
        "frame_rate_hz": FEED_RATE_HZ, "max_image_pixels": MAX_PIXELS, "query_queue_size": QUEUE_SIZE,
        "stats_period_s": 0.5})
    yield process
    assert process.stop() == 0, process.stderr()
    assert "Traceback" not in process.stderr()


@pytest.fixture(scope="module")
def listener(node):
    listener = NodeListener()
    listener.wait_ready(node)
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def babbling(module_ros_environ, babbling_model_dir):
    """A node whose answers never stop by themselves. The SIGINT test ends it, so it runs last."""
    process = NodeProcess(module_ros_environ, {
        "model_path": str(babbling_model_dir), "image_topics": [BABBLE_CAMERA], "max_new_tokens": 8192,
        "frame_rate_hz": 5.0, "stats_period_s": 0.5}, namespace="/babble")
    listener = NodeListener(BABBLE_NODE, name="babble_listener")
    try:
        listener.wait_ready(process)
        yield process, listener
    finally:
        listener.close()
        process.stop()


def ensure_fed(listener) -> None:
    """At least one frame reached the model (a test run alone has no replayed bag before it)."""
    from sensor_msgs.msg import Image
    stats = listener.latest_stats()
    if stats["frames_seen"] > 0:
        return
    rgb = np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    listener.publisher(RAW_CAMERA, Image).publish(rgb_image_msg(rgb))
    assert wait_until(lambda: listener.copy("stats")[-1]["frames_seen"] > 0, 20), "no frame was fed"


# ---- the bag, and questions from another node ---------------------------------------------------

def test_replayed_bag_questions_all_answered(node, listener, demo_bag_job, module_ros_environ, capsys):
    bag = finished(demo_bag_job)
    questions = json.loads((bag / "questions.json").read_text())
    result = run_module("infmllm_ros.ros.replay", str(bag), "--rate", str(REPLAY_RATE), "--remap",
                        "/infmllm/query:=/infmllm_node/query", "--wait-for-subscribers", "20", "--no-progress",
                        env=module_ros_environ, timeout=120)
    assert result.returncode == 0, result.stderr
    infos = {q["id"]: listener.info_for(q["id"], timeout=30) for q in questions}
    unanswered = [qid for qid, info in infos.items() if info is None]
    assert not unanswered, f"no reply to {unanswered}"
    for info in infos.values():
        assert info["status"] == "ok" or (info["status"] in ("refused", "error") and info["reason"]), info
    right, total = Counter(), Counter()
    for q in questions:
        total[q["family"]] += 1
        right[q["family"]] += normalise(infos[q["id"]]["answer"]) == normalise(q["answer"])
    accuracy = {family: right[family] / total[family] for family in total}
    with capsys.disabled():
        model = "embedded" if EMBEDDED else "random (floor: every question answered or refused)"
        print(f"\n[node accuracy, {model} model] " + ", ".join(
            f"{family} {right[family]}/{total[family]}" for family in sorted(total)) +
              f"; overall {sum(right.values())}/{sum(total.values())}")
    if EMBEDDED:
        assert accuracy.get("current", 0.0) >= CURRENT_SCENE_FLOOR, accuracy
    stats = listener.latest_stats()
    camera = stats["cameras"][COMPRESSED_CAMERA]
    # ~1 frame per bag second is offered; a loaded machine slows the worker and the newest frame
    # replaces unfed ones (counted as dropped), so only a share is required to reach the model.
    assert camera["fed"] >= BAG_DURATION_S * 0.2, camera
    accounted = sum(camera[name] for name in ("skipped", "dropped", "bad", "failed", "fed"))
    assert camera["received"] - accounted in (0, 1), f"every frame accounted for (one may be waiting): {camera}"
    assert stats["frames_seen"] >= camera["fed"] and stats["cache_tokens"] > 0 and stats["cache_mb"] > 0
    # the loaded model's objects were frozen out of garbage collection, and the passes are timed
    assert stats["gc_pauses"]["frozen_objects"] > 100_000 and stats["gc_pauses"]["gen0"]["count"] > 0
    newest = max(info["stamp"] for info in infos.values() if info["stamp"])
    assert 1.7e9 < newest < 1.8e9, "answer_info carries the bag's header stamps"


def test_questions_from_another_node_matched_by_id(listener):
    ensure_fed(listener)
    listener.ask("what colour is the square?", "t-1")
    listener.ask("how many objects are in view?")          # plain text: the node makes up an id
    listener.ask("what shape is the red object?", 42)
    first, third = listener.info_for("t-1"), listener.info_for(42)
    plain = wait_until(lambda: next((i for i in listener.copy("infos")
                                     if i["question"] == "how many objects are in view?" and
                                     str(i["id"]).startswith("auto-")), None), 30)
    for info in (first, plain, third):
        assert info and info["status"] == "ok", info
        assert info["total_ms"] > 0 and info["ttft_ms"] >= 0 and info["latency_ms"] >= info["total_ms"] * 0.5
    assert first["question"] == "what colour is the square?"
    fed = listener.latest_stats()["cameras"]
    default = next(camera for camera in (RAW_CAMERA, COMPRESSED_CAMERA) if fed[camera]["fed"])
    assert first["camera"] == default, "no camera named: the first listed camera that has frames"
    # Each camera has its own cache: a question may name its camera, an unknown one is refused.
    listener.ask("what is in view?", "named", camera=COMPRESSED_CAMERA)
    listener.ask("what is in view?", "unknown", camera="/no/such/camera")
    named, unknown = listener.info_for("named"), listener.info_for("unknown")
    assert named["camera"] == COMPRESSED_CAMERA, named
    assert named["status"] == "ok" or (named["refusal"] == "no_frames" and not fed[COMPRESSED_CAMERA]["fed"]), named
    assert unknown["refusal"] == "unknown_camera" and RAW_CAMERA in unknown["reason"], unknown
    # ~/answer carries the same texts, in the same order, as the ok replies on ~/answer_info.
    assert wait_until(lambda: listener.copy("answers") == [i["answer"] for i in listener.copy("infos")
                                                           if i["status"] == "ok"], 10)


# ---- bad input ------------------------------------------------------------------------------------

def _jpeg(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    PILImage.fromarray(rgb).save(buffer, format="JPEG")
    return buffer.getvalue()


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    PILImage.new("L", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


def bad_images():
    """(topic, message, kind the node must count)."""
    from sensor_msgs.msg import CompressedImage, Image
    rgb = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    short_step = rgb_image_msg(rgb)
    short_step.step = 10
    short_data = rgb_image_msg(rgb)
    short_data.data = bytes(short_data.data)[:-7]
    unknown = rgb_image_msg(rgb)
    unknown.encoding = "not_an_encoding"
    huge = Image(height=1000, width=1200, encoding="mono8", step=1200, data=bytes(1200 * 1000))
    jpeg = _jpeg(rgb)
    return [
        (RAW_CAMERA, Image(height=0, width=0, encoding="rgb8", step=0), "empty"),
        (RAW_CAMERA, short_step, "bad_layout"),
        (RAW_CAMERA, short_data, "bad_layout"),
        (RAW_CAMERA, unknown, "unknown_encoding"),
        (RAW_CAMERA, huge, "too_large"),
        (COMPRESSED_CAMERA, CompressedImage(format="jpeg", data=jpeg[:len(jpeg) // 2]), "corrupt"),
        (COMPRESSED_CAMERA, CompressedImage(format="jpeg", data=b"\xff\xd8\xff\xe0 not really a jpeg"), "corrupt"),
        (COMPRESSED_CAMERA, CompressedImage(format="png", data=bytes(range(256)) * 4), "corrupt"),
        (COMPRESSED_CAMERA, CompressedImage(format="png", data=_png(3000, 3000)), "too_large"),
        (COMPRESSED_CAMERA, CompressedImage(format="jpeg", data=b""), "empty"),
        (COMPRESSED_CAMERA, CompressedImage(format="16UC1; compressedDepth", data=jpeg), "unknown_encoding"),
    ]


def settled_cameras(listener) -> dict:
    """Camera counters once no more images are arriving (two stats a second apart agree)."""
    def unchanged():
        first = listener.latest_stats()["cameras"]
        time.sleep(1.0)
        return first if listener.latest_stats()["cameras"] == first else None
    cameras = wait_until(unchanged, 20, interval=0)
    assert cameras, "camera counters never settled"
    return cameras


def test_bad_images_counted_node_keeps_working(node, listener):
    from sensor_msgs.msg import CompressedImage, Image
    before = listener.latest_stats()
    expected = Counter()
    # Sent three times each: the camera QoS is best effort, so one copy may be lost on a busy machine.
    for _ in range(3):
        for topic, msg, kind in bad_images():
            listener.publisher(topic, CompressedImage if topic == COMPRESSED_CAMERA else Image).publish(msg)
            expected[f"image.{kind}"] += 1
            time.sleep(0.01)

    def counted():
        bad = listener.copy("stats")[-1]["bad_input"]
        return all(bad.get(kind, 0) > before["bad_input"].get(kind, 0) for kind in expected)
    assert wait_until(counted, 20), (expected, listener.copy("stats")[-1]["bad_input"])
    bad = listener.latest_stats()["bad_input"]
    for kind in expected:
        assert bad[kind] - before["bad_input"].get(kind, 0) <= expected[kind]

    # Still alive, still taking every encoding, still answering.
    assert node.alive()
    fed_before = settled_cameras(listener)[RAW_CAMERA]
    rgb = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    for encoding in ("rgb8", "bgr8", "rgba8", "bgra8", "mono8"):
        listener.publisher(RAW_CAMERA, Image).publish(rgb_image_msg(rgb, encoding))
        time.sleep(FRAME_PERIOD_S)  # stamped now, > one frame period apart: each one is due
    assert wait_until(lambda: listener.copy("stats")[-1]["cameras"][RAW_CAMERA]["fed"] >= fed_before["fed"] + 3, 10)
    assert listener.copy("stats")[-1]["cameras"][RAW_CAMERA]["bad"] == fed_before["bad"]
    listener.ask("what is in view?", "after-bad-images")
    assert listener.info_for("after-bad-images")["status"] == "ok"


def _string_cdr(payload: bytes) -> bytes:
    """A serialized std_msgs/String carrying arbitrary bytes (what a broken C++ sender could publish)."""
    return b"\x00\x01\x00\x00" + struct.pack("<I", len(payload) + 1) + payload + b"\x00"


def test_bad_queries_refused_with_reason(node, listener):
    from std_msgs.msg import String
    before = listener.latest_stats()["bad_input"]
    sent = [("", "query.empty"), ("   \n ", "query.empty"), ("x" * 1_000_000, "query.too_long"),
            ('{"id": "j-1"}', "query.bad_json"), ('{"id": "j-2", "question": ', "query.bad_json"),
            ('{"id": "j-3", "question": "   "}', "query.empty"),
            (json.dumps({"id": "j-4", "question": "y" * 3000}), "query.too_long")]
    start = len(listener.copy("infos"))
    for text, _ in sent:
        listener.query_publisher.publish(String(data=text))
    listener.send_raw_query(_string_cdr(b"what is \xff\xfe in view?"))
    expected = Counter(kind for _, kind in sent) + Counter({"query.not_utf8": 1})
    replies = wait_until(lambda: len(listener.copy("infos")) >= start + len(sent) + 1 and
                         listener.copy("infos")[start:], 30)
    assert replies and len(replies) == len(sent) + 1, replies
    assert all(r["status"] == "refused" and r["reason"] for r in replies), replies
    by_id = {r["id"]: r for r in replies}
    assert {"j-1", "j-3", "j-4"} <= set(by_id), "a JSON id comes back even on refusal"
    assert "j-2" not in by_id, "no id can be read from broken JSON: it gets a generated one"
    assert "question" in by_id["j-1"]["reason"] and "2000" in by_id["j-4"]["reason"]
    assert any("UTF-8" in r["reason"] for r in replies)
    assert all(len(r["question"]) < 300 for r in replies), "a 1 MB question is not echoed back"

    def counted():
        bad = listener.copy("stats")[-1]["bad_input"]
        return all(bad.get(kind, 0) - before.get(kind, 0) == n for kind, n in expected.items())
    assert wait_until(counted, 10), (expected, listener.copy("stats")[-1]["bad_input"])
    assert node.alive()
    listener.ask("what is in view?", "after-bad-queries")
    assert listener.info_for("after-bad-queries")["status"] == "ok"


def test_flood_of_queries_each_answered_or_refused_busy(node, listener):
    """300 questions at once (well inside the DDS history of ~/query), with malformed queries and
    images in between: every id gets exactly one reply, and each kind of bad input is counted exactly."""
    from sensor_msgs.msg import CompressedImage
    from std_msgs.msg import String
    ensure_fed(listener)
    bad_before = listener.latest_stats()["bad_input"]
    camera = listener.publisher(COMPRESSED_CAMERA, CompressedImage)
    ids = [f"flood-{i}" for i in range(300)]
    wanted = set(ids)
    start = len(listener.copy("infos"))
    for number, query_id in enumerate(ids):
        listener.ask("how many objects are in view?", query_id)
        if number % 30 == 0:
            listener.query_publisher.publish(String(data=json.dumps({"id": f"{query_id}-empty", "question": " "})))
            camera.publish(CompressedImage(format="jpeg", data=b""))

    def replies():
        found = {i["id"]: i for i in listener.copy("infos") if i["id"] in wanted}
        return found if len(found) == len(ids) else None
    found = wait_until(replies, 90, interval=0.2)
    assert found, f"{len(ids) - len({i['id'] for i in listener.copy('infos') if i['id'] in wanted})} " \
                  "flood queries got no reply"
    replies_per_id = Counter(str(info["id"]) for info in listener.copy("infos")[start:])
    assert all(replies_per_id[query_id] == 1 for query_id in ids), "one reply per question, never two"
    empties = [f"{query_id}-empty" for query_id in ids[::30]]
    assert all(replies_per_id[query_id] == 1 for query_id in empties)

    def bad_counted():
        bad = listener.copy("stats")[-1]["bad_input"]
        return bad.get("query.empty", 0) - bad_before.get("query.empty", 0) == len(empties)
    assert wait_until(bad_counted, 10), listener.copy("stats")[-1]["bad_input"]
    statuses = Counter(info["status"] for info in found.values())
    assert set(statuses) <= {"ok", "refused"} and statuses["ok"] >= 1, statuses
    assert all("busy" in info["reason"] for info in found.values() if info["status"] == "refused")
    assert statuses["refused"] > 0, "300 questions at once must overflow a queue of 8"
    assert wait_until(lambda: listener.copy("stats")[-1]["queries"]["busy"] >= statuses["refused"], 10)
    assert node.alive()


def test_parameters_validated_on_change(listener):
    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient
    client = AsyncParameterClient(listener.node, "/infmllm_node")
    assert client.wait_for_services(10)

    def call(future):
        assert wait_until(future.done, 10)
        return future.result()
    names = set(call(client.list_parameters()).result.names)
    assert {spec.name for spec in PARAMETERS} <= names
    results = call(client.set_parameters([Parameter("max_new_tokens", value=0)])).results
    assert not results[0].successful and "max_new_tokens" in results[0].reason
    results = call(client.set_parameters([Parameter("quantization", value="cpu-int8")])).results
    assert not results[0].successful and "cleanup" in results[0].reason, "model parameters: only while unconfigured"
    results = call(client.set_parameters([Parameter("query_queue_size", value=QUEUE_SIZE)])).results
    assert results[0].successful, results[0].reason
    results = call(client.set_parameters([Parameter("frame_rate_hz", value=2 * FEED_RATE_HZ)])).results
    assert results[0].successful, results[0].reason
    # The node still feeds frames at the new rate.
    from sensor_msgs.msg import Image
    time.sleep(FRAME_PERIOD_S)
    fed = listener.latest_stats()["cameras"][RAW_CAMERA]["fed"]
    listener.publisher(RAW_CAMERA, Image).publish(rgb_image_msg(np.zeros((48, 64, 3), np.uint8)))
    assert wait_until(lambda: listener.copy("stats")[-1]["cameras"][RAW_CAMERA]["fed"] > fed, 10)
    results = call(client.set_parameters([Parameter("frame_rate_hz", value=FEED_RATE_HZ)])).results
    assert results[0].successful, results[0].reason


# ---- replay from sqlite3 storage ----------------------------------------------------------------

def test_replay_reads_sqlite3_bags(listener, demo_bag_job, module_ros_environ, tmp_path):
    from rosbags.rosbag2 import Reader, StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore
    from sensor_msgs.msg import CompressedImage
    from std_msgs.msg import String
    source, target = finished(demo_bag_job), tmp_path / "sqlite_bag"
    store = get_typestore(Stores.ROS2_KILTED)
    kept = []
    with Reader(source) as reader, Writer(target, version=8, storage_plugin=StoragePlugin.SQLITE3) as writer:
        connections = {c.topic: writer.add_connection(c.topic, c.msgtype, typestore=store) for c in reader.connections}
        for connection, timestamp, raw in reader.messages():
            writer.write(connections[connection.topic], timestamp, raw)
            kept.append((connection.topic, bytes(raw)))
            if len(kept) >= 40:
                break
    assert (target / "sqlite_bag.db3").is_file()
    images, queries = [], []
    listener.node.create_subscription(CompressedImage, "/sqlite/image", lambda m: images.append(bytes(m.data)), 100)
    listener.node.create_subscription(String, "/sqlite/query", lambda m: queries.append(m.data), 100)
    result = run_module("infmllm_ros.ros.replay", str(target), "--rate", "4", "--no-progress",
                        "--wait-for-subscribers", "10", "--remap", "/camera/image_raw/compressed:=/sqlite/image",
                        "/infmllm/query:=/sqlite/query", env=module_ros_environ, timeout=60)
    assert result.returncode == 0, result.stderr
    n_images = sum(topic == COMPRESSED_CAMERA for topic, _ in kept)
    n_queries = len(kept) - n_images
    assert n_queries >= 1
    assert wait_until(lambda: len(images) == n_images and len(queries) == n_queries, 10), (len(images), len(queries))
    assert f"replayed {len(kept)} messages" in result.stdout
    store_msg = store.deserialize_cdr(next(raw for topic, raw in kept if topic == COMPRESSED_CAMERA),
                                      "sensor_msgs/msg/CompressedImage")
    assert images[0] == bytes(store_msg.data), "image bytes arrive unchanged"


# ---- failing to start -----------------------------------------------------------------------------

def test_bad_model_path_or_setting_exits_with_one_clear_line(module_ros_environ, tmp_path):
    cases = {"model_path": ["-p", f"model_path:={tmp_path / 'no_such_model'}"],
             "config.json": ["-p", f"model_path:={tmp_path}"],
             "not yet supported": ["-p", "quantization:=4bit"],
             "did you mean cache_budget": ["-p", "cache_budgett:=100"]}
    processes = {expected: subprocess.Popen([sys.executable, "-m", "infmllm_ros.ros.node", "--ros-args", *args],
                                            env=module_ros_environ, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
                 for expected, args in cases.items()}
    for expected, process in processes.items():
        stdout, stderr = process.communicate(timeout=90)
        lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
        assert process.returncode == 2, stderr
        assert len(lines) == 1 and expected in lines[0] and "Traceback" not in stderr, lines


# ---- the long answer and SIGINT (they end the babbling node: keep them last) -----------------------

def test_cameras_keep_flowing_during_a_long_answer(babbling):
    from sensor_msgs.msg import Image
    node, listener = babbling
    publisher = listener.publisher(BABBLE_CAMERA, Image)
    rgb = np.random.default_rng(2).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    stop = threading.Event()

    def stream_frames():
        while not stop.wait(0.05):  # 20 Hz
            publisher.publish(rgb_image_msg(rgb))
    sender = threading.Thread(target=stream_frames, daemon=True)
    sender.start()
    try:
        time.sleep(0.5)
        listener.ask("what is in view?", "long-1")
        assert wait_until(lambda: listener.copy("stats")[-1]["answering"], 20), "the long answer never started"
        start = len(listener.copy("stats"))
        pieces_at_start = len(listener.copy("pieces"))
        assert wait_until(lambda: len(listener.copy("stats")) >= start + 5, 10)
        during = listener.copy("stats")[start:start + 5]
    finally:
        stop.set()
        sender.join(5)
    assert all(s["answering"] for s in during), "the answer ended too soon to prove anything"
    received = [s["cameras"][BABBLE_CAMERA]["received"] for s in during]
    assert all(b > a for a, b in zip(received, received[1:])), f"camera callbacks stalled: {received}"
    assert len(listener.copy("pieces")) > pieces_at_start, "~/answer_stream sends pieces while answering"
    assert listener.info_for("long-1", timeout=0) is None
    assert node.alive()


def test_sigint_mid_answer_exits_cleanly(babbling):
    """Ctrl-C while answering, with questions waiting: the answer is abandoned, and the one in hand
    and every waiting question are refused (shutdown) before the node exits."""
    node, listener = babbling
    in_hand = "long-1"   # still babbling from the test before
    if not listener.copy("stats")[-1]["answering"]:
        in_hand = "long-2"
        listener.ask("what is in view?", in_hand)
        assert wait_until(lambda: listener.copy("stats")[-1]["answering"], 20)
    waiting = [f"waiting-{i}" for i in range(3)]
    for query_id in waiting:
        listener.ask("what is in view?", query_id)
    assert wait_until(lambda: listener.copy("stats")[-1]["queued_queries"] == len(waiting), 10)
    started = time.monotonic()
    code = node.stop(timeout=30)
    stderr = node.stderr()
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert time.monotonic() - started < 15, "the answer in progress should be abandoned, not finished"
    for query_id in [in_hand, *waiting]:
        info = listener.info_for(query_id, timeout=10)
        assert info and info["status"] == "refused" and info["refusal"] == "shutdown", (query_id, info)
