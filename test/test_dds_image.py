"""A 640x480 sensor_msgs/Image published by one process arrives intact in another, over real DDS."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image

sys.path.insert(0, str(Path(__file__).parent / "ros_programs"))
from publish_test_image import image_pattern  # noqa: E402


def receive_one_image(topic: str, timeout_s: float) -> Image | None:
    context = Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("test_image_subscriber", context=context)
        received: list[Image] = []
        node.create_subscription(Image, topic, received.append,
                                 QoSProfile(depth=5, reliability=QoSReliabilityPolicy.RELIABLE))
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + timeout_s
        while not received and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        node.destroy_node()
        return received[0] if received else None
    finally:
        rclpy.shutdown(context=context)


def run_image_round_trip(ros_environ: dict[str, str]) -> tuple[Image | None, str]:
    publisher = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "ros_programs" / "publish_test_image.py"),
         "/test/image_raw", "15"],
        env=ros_environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        image = receive_one_image("/test/image_raw", timeout_s=15)
    finally:
        publisher.terminate()
        _, stderr = publisher.communicate(timeout=20)
    return image, stderr


def assert_intact(image: Image | None) -> None:
    assert image is not None, "no image arrived over DDS"
    assert (image.height, image.width, image.encoding, image.step) == (480, 640, "rgb8", 1920)
    assert image.header.frame_id == "camera"
    pixels = np.frombuffer(bytes(image.data), dtype=np.uint8).reshape(480, 640, 3)
    np.testing.assert_array_equal(pixels, image_pattern())


def test_image_crosses_processes_intact(ros_environ):
    image, _ = run_image_round_trip(ros_environ)
    assert_intact(image)


def test_image_crosses_processes_with_shipped_fastdds_profile(ros_environ, repo_root, monkeypatch):
    profile = repo_root / "config" / "fastdds_shm.xml"
    monkeypatch.setenv("FASTDDS_DEFAULT_PROFILES_FILE", str(profile))
    ros_environ = {**ros_environ, "FASTDDS_DEFAULT_PROFILES_FILE": str(profile)}
    image, stderr = run_image_round_trip(ros_environ)
    assert "XMLPARSER" not in stderr, f"Fast DDS rejected {profile.name}:\n{stderr}"
    assert_intact(image)
