"""Publish one deterministic 640x480 rgb8 image (repeatedly, until a subscriber has matched).

Run as a separate process by test_dds_image.py, so the message really crosses DDS.
"""

import sys
import time

import numpy as np
import rclpy
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image


def image_pattern(height: int = 480, width: int = 640) -> np.ndarray:
    """A pattern where every byte depends on its position, so any corruption is visible."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([(x * 7 + y) % 256, (y * 3 + x // 5) % 256, (x ^ y) % 256], axis=-1).astype(np.uint8)


def main() -> int:
    topic, seconds = sys.argv[1], float(sys.argv[2])
    rclpy.init()
    node = rclpy.create_node("test_image_publisher")
    qos = QoSProfile(depth=5, reliability=QoSReliabilityPolicy.RELIABLE,
                     durability=QoSDurabilityPolicy.VOLATILE)
    publisher = node.create_publisher(Image, topic, qos)
    pixels = image_pattern()
    msg = Image(height=480, width=640, encoding="rgb8", is_bigendian=0, step=640 * 3)
    msg.header.frame_id = "camera"
    msg.data = pixels.tobytes()  # bytes, not a numpy array: assigning an array costs ~46 ms
    deadline = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < deadline:
        if publisher.get_subscription_count() > 0:
            msg.header.stamp = node.get_clock().now().to_msg()
            publisher.publish(msg)
            sent += 1
        time.sleep(0.1)
    print(f"sent {sent}", flush=True)
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
