"""`infmllm-replay BAG`: play a rosbag2 bag's camera and query topics with their recorded timing.

Like `ros2 bag play` for the three message types this package consumes (sensor_msgs Image and
CompressedImage, std_msgs String), for machines without rosbag2_py: the bag (MCAP or sqlite3) is
read with `rosbags`, and each message's recorded CDR bytes are published unchanged through rclpy,
so nothing is deserialized or re-encoded on the way.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import rclpy
from rclpy.duration import Duration
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rosbags.rosbag2 import Reader, ReaderError
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String
from tqdm import tqdm

MESSAGE_TYPES = {"sensor_msgs/msg/Image": Image, "sensor_msgs/msg/CompressedImage": CompressedImage,
                 "std_msgs/msg/String": String}
_QOS = QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE)
DISCOVERY_SETTLE_S = 1.0
ACK_TIMEOUT_S = 5.0


def parse_remaps(items: Sequence[str]) -> dict[str, str]:
    """['/from:=/to', ...] -> {'/from': '/to'}."""
    remaps = {}
    for item in items:
        source, sep, target = item.partition(":=")
        if not sep or not source or not target:
            raise ValueError(f"--remap {item!r}: expected /from:=/to")
        remaps[source] = target
    return remaps


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))


def _wait_for_subscribers(publishers: dict, timeout_s: float) -> list[str]:
    """Wait until every topic has a subscriber (or the timeout); returns the topics still without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [topic for topic, publisher in publishers.items() if publisher.get_subscription_count() == 0]
        if not missing:
            # Discovery is two-sided: the writer may see the reader before the reader has matched
            # the writer, and reliable samples sent in that gap are lost. Let it settle.
            time.sleep(DISCOVERY_SETTLE_S)
            return missing
        if time.monotonic() >= deadline:
            return missing
        time.sleep(0.05)


def replay(bag: Path, node, rate: float = 1.0, loop: bool = False, remaps: dict[str, str] | None = None,
           topics: Sequence[str] | None = None, wait_for_subscribers_s: float = 0.0, progress: bool = True) -> int:
    """Publish the bag's supported topics on `node`; returns how many messages went out."""
    remaps = remaps or {}
    sent = 0
    with Reader(bag) as reader:
        connections = [c for c in reader.connections if not topics or c.topic in topics]
        for connection in connections:
            if connection.msgtype not in MESSAGE_TYPES:
                print(f"skipping {connection.topic} ({connection.msgtype}): not an image or string topic",
                      file=sys.stderr)
        connections = [c for c in connections if c.msgtype in MESSAGE_TYPES]
        if not connections:
            raise ValueError(f"{bag}: no Image, CompressedImage or String topic to play")
        publishers = {}
        for connection in connections:
            topic = remaps.get(connection.topic, connection.topic)
            if topic not in publishers:
                publishers[topic] = node.create_publisher(MESSAGE_TYPES[connection.msgtype], topic, _QOS)
        by_connection = {c.id: publishers[remaps.get(c.topic, c.topic)] for c in connections}
        if wait_for_subscribers_s > 0:
            missing = _wait_for_subscribers(publishers, wait_for_subscribers_s)
            if missing:
                print(f"no subscriber after {wait_for_subscribers_s:g} s on {missing}; playing anyway", file=sys.stderr)
        total = sum(c.msgcount for c in connections)
        while True:
            first_ns, start = None, time.monotonic()
            with tqdm(total=total, unit="msg", desc=bag.name, disable=not progress) as bar:
                for connection, timestamp, raw in reader.messages(connections=connections):
                    first_ns = timestamp if first_ns is None else first_ns
                    _sleep_until(start + (timestamp - first_ns) / 1e9 / rate)
                    by_connection[connection.id].publish(bytes(raw))
                    sent += 1
                    bar.update()
            if not loop:
                # Reliable samples still in flight die with the process: wait for their acks.
                for publisher in publishers.values():
                    publisher.wait_for_all_acked(Duration(seconds=ACK_TIMEOUT_S))
                return sent


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ros_args = argv[argv.index("--ros-args"):] if "--ros-args" in argv else []
    argv = argv[:len(argv) - len(ros_args)]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bag", type=Path, help="rosbag2 directory (MCAP or sqlite3)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor")
    parser.add_argument("--loop", action="store_true", help="start again at the end, until Ctrl-C")
    parser.add_argument("--remap", nargs="+", action="extend", default=[], metavar="/FROM:=/TO",
                        help="publish a bag topic under another name")
    parser.add_argument("--topics", nargs="+", default=None, help="play only these bag topics")
    parser.add_argument("--wait-for-subscribers", type=float, default=0.0, metavar="SECONDS",
                        help="first wait (up to this long) until every topic has a subscriber")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be positive")
    try:
        remaps = parse_remaps(args.remap)
    except ValueError as error:
        parser.error(str(error))
    if not args.bag.is_dir() and not args.bag.is_file():
        print(f"infmllm-replay: error: {args.bag} does not exist", file=sys.stderr)
        return 2
    # Our own Ctrl-C handling: a KeyboardInterrupt in the sleep loop ends playback cleanly.
    rclpy.init(args=["infmllm_replay", *ros_args], signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("infmllm_replay")
    started = time.monotonic()
    try:
        sent = replay(args.bag, node, args.rate, args.loop, remaps, args.topics, args.wait_for_subscribers,
                      progress=not args.no_progress)
        print(f"replayed {sent} messages from {args.bag} in {time.monotonic() - started:.1f} s")
    except KeyboardInterrupt:
        print(f"stopped after {time.monotonic() - started:.1f} s")
    except ValueError as error:
        print(f"infmllm-replay: error: {error}", file=sys.stderr)
        return 2
    except (ReaderError, OSError) as error:
        print(f"infmllm-replay: error: cannot read {args.bag} as a rosbag2 bag: {error}", file=sys.stderr)
        return 2
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
