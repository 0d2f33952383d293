"""Two cameras into one node for minutes: a raw rgb8 camera at 30 Hz and a JPEG one at 15 Hz.

What an integrator checks before putting two cameras on one node: that no image callback holds
the executor (callback durations), that every frame is accounted for per camera (received =
skipped + dropped + bad + fed, exactly), that memory stays flat, and that questions naming
either camera are answered meanwhile. Three processes over DDS: the node (infmllm-run), a
publisher (`python -m infmllm_ros.benchmarks.two_cameras --publish`) and this observer, which
reads ~/stats, ~/answer_info and the node's RSS from /proc.

No bag: ten minutes of 640x480 rgb8 at 30 Hz would be 16 GB. The publisher renders a few
dozen frames of a synthetic episode once and sends them round with fresh stamps, so this
measures the node's plumbing, not answer accuracy (the quality and node suites do that).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

from infmllm_ros.ros.demo import AnswerListener, demo_environ, stop
from infmllm_ros.ros.run import NODE_NAME, default_params_file
from infmllm_ros.ros.stats import percentile

from .node_e2e import gc_columns, slow_work_columns

RAW_TOPIC, RAW_HZ = "/cam_raw/image_raw", 30.0
JPEG_TOPIC, JPEG_HZ = "/cam_jpeg/image_raw/compressed", 15.0
QUERY_EVERY_S = 5.0
DISTINCT_FRAMES = 32
SAMPLE_EVERY_S = 10.0
PUBLISHER_SEED = 21
QUESTIONS = ("how many objects are in view?", "what colour is the circle?", "what left the view most recently?")


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def publish(duration_s: float) -> int:
    """The publisher process: both cameras and a question every QUERY_EVERY_S, for `duration_s`."""
    import cv2
    import rclpy
    from builtin_interfaces.msg import Time
    from rclpy.qos import QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import CompressedImage, Image
    from std_msgs.msg import String

    from infmllm_ros.synthetic.world import generate_episode

    episode = generate_episode(PUBLISHER_SEED, float(DISTINCT_FRAMES))
    frames = [episode.render(t + 0.5) for t in range(DISTINCT_FRAMES)]
    raw, jpeg = [], []
    for rgb in frames:   # built once: a publish then only sets the stamp
        image = Image(height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8", step=rgb.shape[1] * 3)
        image.data = rgb.tobytes()
        raw.append(image)
        ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 80])
        assert ok
        compressed = CompressedImage(format="jpeg")
        compressed.data = encoded.tobytes()
        jpeg.append(compressed)
    rclpy.init()
    node = rclpy.create_node("two_camera_publisher")
    raw_pub = node.create_publisher(Image, RAW_TOPIC, qos_profile_sensor_data)
    jpeg_pub = node.create_publisher(CompressedImage, JPEG_TOPIC, qos_profile_sensor_data)
    query_pub = node.create_publisher(String, f"/{NODE_NAME}/query",
                                      QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE))
    deadline = time.monotonic() + 30.0
    while query_pub.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)   # let discovery settle both ways
    schedule = [(1.0 / RAW_HZ, raw_pub, raw), (1.0 / JPEG_HZ, jpeg_pub, jpeg)]
    start = time.monotonic()
    due = [start, start]
    sent = [0, 0]
    next_query, asked = start + QUERY_EVERY_S, 0
    while (now := time.monotonic()) < start + duration_s:
        for index, (period, publisher, messages) in enumerate(schedule):
            if now >= due[index]:
                message = messages[(sent[index] // max(1, round(1.0 / period))) % len(messages)]
                seconds = time.time()
                message.header.stamp = Time(sec=int(seconds), nanosec=int((seconds % 1) * 1e9))
                message.header.frame_id = publisher.topic_name
                publisher.publish(message)
                sent[index] += 1
                due[index] += period
        if now >= next_query:
            camera = (RAW_TOPIC, JPEG_TOPIC)[asked % 2]
            query_pub.publish(String(data=json.dumps({"id": asked, "camera": camera,
                                                      "question": QUESTIONS[asked % len(QUESTIONS)]})))
            asked += 1
            next_query += QUERY_EVERY_S
        time.sleep(max(0.0, min(due + [next_query]) - time.monotonic()))
    print(json.dumps({"sent_raw": sent[0], "sent_jpeg": sent[1], "queries": asked}), flush=True)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def run_two_cameras(duration_s: float, params: Path | None = None, grace_s: float = 20.0) -> dict:
    """One row: per-camera accounting, callback and ingest tails, RSS over time, answers."""
    env = demo_environ()
    # raw frames are larger than Fast DDS's default shared-memory segment: the README's profile,
    # as an integrator is told to use it (unless one is set already)
    env.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(default_params_file().parent / "fastdds_shm.xml"))
    os.environ.update(env)
    node_command = [sys.executable, "-m", "infmllm_ros.ros.run", "--params", str(params or default_params_file()),
                    "--ros-args", "-p", f"image_topics:=[{RAW_TOPIC}]", "-p",
                    f"compressed_image_topics:=[{JPEG_TOPIC}]"]
    listener = AnswerListener()
    node = publisher = None
    rss: list[tuple[float, float]] = []
    infos: dict = {}
    peaks: dict[str, float] = {}
    try:
        node = subprocess.Popen(node_command, env=env)
        deadline = time.monotonic() + 180.0
        while not listener.stats_seen.wait(0.2):
            if node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the node did not start (exit code {node.poll()})")
        publisher = subprocess.Popen([sys.executable, "-m", "infmllm_ros.benchmarks.two_cameras", "--publish",
                                      "--duration", str(duration_s)], env=env, stdout=subprocess.PIPE, text=True)
        started = time.monotonic()
        next_sample = started
        while publisher.poll() is None:
            if time.monotonic() >= next_sample:
                rss.append((time.monotonic() - started, rss_mb(node.pid)))
                next_sample += SAMPLE_EVERY_S
            note_peaks(peaks, listener.last_stats)
            try:
                info = listener.infos.get(timeout=0.5)
                infos[info["id"]] = info
            except queue.Empty:
                pass
        sent = json.loads(publisher.stdout.read().strip().splitlines()[-1])
        end = time.monotonic() + grace_s
        while len(infos) < sent["queries"] and time.monotonic() < end:
            try:
                info = listener.infos.get(timeout=0.5)
                infos[info["id"]] = info
            except queue.Empty:
                pass
        time.sleep(2.5)   # two more ~/stats periods: the last counters include the last frames
        stats = listener.last_stats or {}
        note_peaks(peaks, stats)
    finally:
        stop(publisher)
        stop(node)
        listener.close()
    row = summarise(duration_s, sent, stats, rss, infos)
    row.update(peaks)
    return row


def note_peaks(peaks: dict[str, float], stats: dict | None) -> None:
    """The worst callback and ingest seen in any ~/stats message: the node's latency windows hold
    only the last few hundred samples, so the run's maximum is the maximum over its snapshots."""
    for name in ("image_callback", "ingest"):
        value = ((stats or {}).get("latency", {}).get(name) or {}).get("max_ms")
        if value is not None:
            peaks[f"{name}_run_max_ms"] = max(peaks.get(f"{name}_run_max_ms", 0.0), value)


def summarise(duration_s: float, sent: dict, stats: dict, rss: list[tuple[float, float]], infos: dict) -> dict:
    cameras = stats.get("cameras", {})
    row = {"duration_s": duration_s, "sent_raw": sent["sent_raw"], "sent_jpeg": sent["sent_jpeg"]}
    for name, topic in (("raw", RAW_TOPIC), ("jpeg", JPEG_TOPIC)):
        counts = cameras.get(topic, {})
        for key in ("received", "skipped", "dropped", "bad", "failed", "fed"):
            row[f"{name}_{key}"] = counts.get(key, 0)
        row[f"{name}_accounted"] = counts.get("received", 0) == sum(
            counts.get(key, 0) for key in ("skipped", "dropped", "bad", "failed", "fed"))
    latency = stats.get("latency", {})
    for name in ("image_callback", "ingest", "answer"):
        for key in ("p50_ms", "p99_ms", "max_ms"):
            row[f"{name}_{key}"] = latency.get(name, {}).get(key, float("nan"))
    answered = [info for info in infos.values() if info["status"] == "ok"]
    row.update({"queries": sent["queries"], "answered": len(answered),
                "answered_per_camera": {topic: sum(1 for info in answered if info.get("camera") == topic)
                                        for topic in (RAW_TOPIC, JPEG_TOPIC)},
                "not_answered": sent["queries"] - len(answered)})
    seconds = [info["latency_ms"] / 1000 for info in answered if info.get("latency_ms") is not None]
    for q in (50, 95, 99):
        value = percentile(seconds, q)
        row[f"answer_p{q}_ms"] = 1000 * value if value is not None else float("nan")
    row.update(gc_columns(stats.get("gc_pauses", {})))
    row.update(slow_work_columns(stats.get("slow_work", {})))
    row["rss_mb"] = [[round(t, 1), round(mb, 1)] for t, mb in rss]
    settled = [mb for t, mb in rss if t >= 60.0]   # after the first minute: model loaded, caches full
    row["rss_first_mb"], row["rss_last_mb"] = (settled[0], settled[-1]) if settled else (float("nan"),) * 2
    row["rss_growth_mb"] = row["rss_last_mb"] - row["rss_first_mb"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publish", action="store_true", help="be the publisher process")
    parser.add_argument("--duration", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.publish:
        return publish(args.duration)
    print(json.dumps(run_two_cameras(args.duration), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
