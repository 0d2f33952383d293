"""`make demo` / `infmllm-demo`: the node on the demo bag, with its answers scored as they arrive.

Three processes over DDS, as on a robot: the node (infmllm-run with config/infmllm.yaml, the
embedded model unless --model-path), the bag replayed by infmllm-replay (camera frames, and the
bag's questions remapped from /infmllm/query to the node's ~/query), and this one, which listens
on ~/answer_info and prints each question, answer, expected answer and latency, then a summary.
It exits 0 whenever the run completed, whatever the accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from infmllm_ros.synthetic.demo_bag import DEFAULT_OUT, IMAGE_TOPIC, QUERY_TOPIC, write_demo_bag
from infmllm_ros.synthetic.questions import FEED_RATE_HZ

from .run import NODE_NAME, default_params_file
from .stats import percentile

NODE_QUERY_TOPIC = f"/{NODE_NAME}/query"
READY_TIMEOUT_S = 180.0
# The last id that is safe on Linux (higher ones reach the ephemeral port range) and outside the
# 1..100 the tests claim, so a demo never talks to a test run or to a robot on the default 0.
DEMO_DOMAIN_ID = "101"


def normalise(text: str) -> str:
    """Answers are compared lower-case, whitespace-collapsed, without final punctuation."""
    return " ".join(text.lower().strip().rstrip(".!?").split())


def is_correct(answer: str, expected: str) -> bool:
    return normalise(answer) == normalise(expected)


def demo_environ() -> dict[str, str]:
    """This process's environment, with a domain of its own unless the user chose one."""
    env = dict(os.environ)
    env.setdefault("ROS_DOMAIN_ID", DEMO_DOMAIN_ID)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    # The embedded model is tiny: one torch thread is as fast as several on an idle machine, and
    # ~100x faster than two on a busy one (OpenMP threads then fight every other process).
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class AnswerListener:
    """~/answer_info and ~/stats of the node, collected on an executor thread of our own."""

    def __init__(self) -> None:
        import rclpy
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        from std_msgs.msg import String

        from .background_spin import BackgroundSpin
        rclpy.init(args=[])
        self.node = rclpy.create_node("infmllm_demo")
        self.infos: queue.Queue[dict] = queue.Queue()
        self.stats_seen = threading.Event()
        reliable = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)
        self.node.create_subscription(String, f"/{NODE_NAME}/answer_info",
                                      lambda msg: self.infos.put(json.loads(msg.data)), reliable)
        self.node.create_subscription(String, f"/{NODE_NAME}/stats", lambda msg: self.stats_seen.set(), 10)
        self._spin = BackgroundSpin(self.node)

    def close(self) -> None:
        self._spin.stop()


def ensure_bag(bag: Path) -> list[dict]:
    """The bag's questions; the default demo bag is written first when it is missing."""
    if not (bag / "questions.json").is_file():
        print(f"demo: writing the demo bag to {bag} (once)", flush=True)
        write_demo_bag(bag)
    return json.loads((bag / "questions.json").read_text())


def print_answer(info: dict, expected: dict | None) -> bool:
    if expected is None:
        print(f"  [{info['id']}] (not a bag question) {info['status']}: {info['answer']!r}")
        return False
    correct = info["status"] == "ok" and is_correct(info["answer"], expected["answer"])
    outcome = info["answer"] if info["status"] == "ok" else f"<{info['status']}: {info['reason']}>"
    latency = f"{info['latency_ms']:.0f} ms" if info.get("latency_ms") is not None else "-"
    print(f"  [{info['id']} {expected['family']:>7}] {expected['question']}\n"
          f"      answer {outcome!r}  expected {expected['answer']!r}  {'OK' if correct else 'wrong'}  {latency}",
          flush=True)
    return correct


def summary_line(questions: list[dict], infos: dict[str, dict], correct: set[str]) -> str:
    total = Counter(q["family"] for q in questions)
    right = Counter(q["family"] for q in questions if q["id"] in correct)
    latencies = [i["latency_ms"] / 1000.0 for i in infos.values() if i.get("latency_ms") is not None]
    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    ms = (lambda s: "-" if s is None else f"{s * 1000:.0f} ms")
    families = ", ".join(f"{family} {right[family]}/{total[family]}" for family in sorted(total))
    refused = sum(1 for i in infos.values() if i["status"] != "ok")
    unanswered = sum(1 for q in questions if q["id"] not in infos)
    accuracy = len(correct) / len(questions) if questions else 0.0
    return (f"demo: accuracy {len(correct)}/{len(questions)} = {accuracy:.1%} ({families}); latency p50 {ms(p50)}, "
            f"p95 {ms(p95)}; {refused} refused or failed, {unanswered} unanswered")


def stop(process: subprocess.Popen | None, timeout: float = 20.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bag", type=Path, default=Path(DEFAULT_OUT), help="rosbag2 directory with questions.json")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed (the node's frame rate follows)")
    parser.add_argument("--model-path", default="", help="model directory ('' = the embedded model)")
    parser.add_argument("--params", type=Path, default=default_params_file(), help="node params YAML")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds to wait for answers after the bag ends")
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be positive")

    questions = ensure_bag(args.bag)
    expected = {q["id"]: q for q in questions}
    env = demo_environ()
    os.environ.update(env)  # our own listener joins the same domain
    print(f"demo: {len(questions)} questions over {args.bag} at rate {args.rate:g}, ROS_DOMAIN_ID "
          f"{env['ROS_DOMAIN_ID']}", flush=True)
    node_command = [sys.executable, "-m", "infmllm_ros.ros.run", "--params", str(args.params), "--ros-args",
                    "-p", "image_topics:=[]", "-p", f"compressed_image_topics:=[{IMAGE_TOPIC}]",
                    "-p", f"frame_rate_hz:={float(FEED_RATE_HZ * args.rate)}"]
    if args.model_path:
        node_command += ["-p", f"model_path:={args.model_path}"]
    replay_command = [sys.executable, "-m", "infmllm_ros.ros.replay", str(args.bag), "--rate", str(args.rate),
                      "--remap", f"{QUERY_TOPIC}:={NODE_QUERY_TOPIC}", "--wait-for-subscribers", "20",
                      "--no-progress"]

    listener = AnswerListener()
    node = replay = None
    infos: dict[str, dict] = {}
    correct: set[str] = set()

    def drain(timeout: float) -> None:
        try:
            info = listener.infos.get(timeout=timeout)
        except queue.Empty:
            return
        infos[info["id"]] = info
        if print_answer(info, expected.get(info["id"])):
            correct.add(info["id"])

    try:
        node = subprocess.Popen(node_command, env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not listener.stats_seen.wait(0.2):
            if node.poll() is not None or time.monotonic() > deadline:
                print(f"demo: the node did not start (exit code {node.poll()})", file=sys.stderr)
                return 1
        replay = subprocess.Popen(replay_command, env=env)
        while replay.poll() is None:
            drain(0.2)
        deadline = time.monotonic() + args.grace
        while len(set(infos) & set(expected)) < len(expected) and time.monotonic() < deadline:
            drain(0.2)
        print(summary_line(questions, infos, correct), flush=True)
        return 0
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    finally:
        stop(replay)
        stop(node)
        listener.close()


if __name__ == "__main__":
    sys.exit(main())
