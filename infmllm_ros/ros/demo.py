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
from dataclasses import dataclass, field
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
    """~/answer_info, ~/stats and ~/query of the node, collected on an executor thread of our own.

    Queries are heard too, so an answer's latency can be timed as another node sees it: from the
    query's arrival to the answer's, both over DDS.
    """

    def __init__(self) -> None:
        import rclpy
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        from std_msgs.msg import String

        from .background_spin import BackgroundSpin
        rclpy.init(args=[])
        self.node = rclpy.create_node("infmllm_demo")
        self.infos: queue.Queue[dict] = queue.Queue()
        self.stats_seen = threading.Event()
        self.last_stats: dict | None = None
        self.query_heard: dict[str, float] = {}   # query id -> time.monotonic() of its arrival here
        reliable = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)
        self.node.create_subscription(String, f"/{NODE_NAME}/answer_info", self._on_info, reliable)
        self.node.create_subscription(String, f"/{NODE_NAME}/stats", self._on_stats, 10)
        self.node.create_subscription(String, NODE_QUERY_TOPIC, self._on_query, reliable)
        self._spin = BackgroundSpin(self.node)

    def _on_info(self, msg) -> None:
        info = json.loads(msg.data)
        info["heard_at"] = time.monotonic()
        self.infos.put(info)

    def _on_stats(self, msg) -> None:
        self.last_stats = json.loads(msg.data)
        self.stats_seen.set()

    def _on_query(self, msg) -> None:
        try:
            self.query_heard.setdefault(str(json.loads(msg.data)["id"]), time.monotonic())
        except (ValueError, KeyError, TypeError):
            pass   # not one of ours; the node reports malformed queries itself

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


@dataclass
class NodeRun:
    """What one node-on-a-bag run produced."""

    questions: list[dict]
    infos: dict[str, dict] = field(default_factory=dict)
    correct: set[str] = field(default_factory=set)
    query_heard: dict[str, float] = field(default_factory=dict)
    last_stats: dict | None = None
    ok: bool = False


def run_node_on_bag(bag: Path, rate: float = 1.0, model_path: str = "", params: Path | None = None,
                    grace: float = 30.0, show: bool = True, replay_progress: bool = False) -> NodeRun:
    """Start the node, replay the bag into it, collect every answer (or until `grace` runs out)."""
    questions = ensure_bag(bag)
    expected = {q["id"]: q for q in questions}
    env = demo_environ()
    os.environ.update(env)  # our own listener joins the same domain
    print(f"demo: {len(questions)} questions over {bag} at rate {rate:g}, ROS_DOMAIN_ID "
          f"{env['ROS_DOMAIN_ID']}", flush=True)
    node_command = [sys.executable, "-m", "infmllm_ros.ros.run", "--params", str(params or default_params_file()),
                    "--ros-args", "-p", "image_topics:=[]", "-p", f"compressed_image_topics:=[{IMAGE_TOPIC}]",
                    "-p", f"frame_rate_hz:={float(FEED_RATE_HZ)}"]  # stamp time: the same frames at any rate
    if model_path:
        node_command += ["-p", f"model_path:={model_path}"]
    replay_command = [sys.executable, "-m", "infmllm_ros.ros.replay", str(bag), "--rate", str(rate),
                      "--remap", f"{QUERY_TOPIC}:={NODE_QUERY_TOPIC}", "--wait-for-subscribers", "20"]
    if not replay_progress:
        replay_command.append("--no-progress")

    listener = AnswerListener()
    run = NodeRun(questions=questions)
    node = replay = None

    def drain(timeout: float) -> None:
        try:
            info = listener.infos.get(timeout=timeout)
        except queue.Empty:
            return
        run.infos[info["id"]] = info
        question = expected.get(info["id"])
        correct = print_answer(info, question) if show else (
            question is not None and info["status"] == "ok" and is_correct(info["answer"], question["answer"]))
        if correct:
            run.correct.add(info["id"])

    try:
        node = subprocess.Popen(node_command, env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not listener.stats_seen.wait(0.2):
            if node.poll() is not None or time.monotonic() > deadline:
                print(f"demo: the node did not start (exit code {node.poll()})", file=sys.stderr)
                return run
        replay = subprocess.Popen(replay_command, env=env)
        while replay.poll() is None:
            drain(0.2)
        deadline = time.monotonic() + grace
        while len(set(run.infos) & set(expected)) < len(expected) and time.monotonic() < deadline:
            drain(0.2)
        time.sleep(1.5)   # one more ~/stats period, so the last counters include the end of the bag
        run.ok = True
        return run
    finally:
        stop(replay)
        stop(node)
        run.last_stats = listener.last_stats
        run.query_heard = dict(listener.query_heard)
        listener.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bag", type=Path, default=Path(DEFAULT_OUT), help="rosbag2 directory with questions.json")
    parser.add_argument("--rate", type=float, default=1.0,
                        help="playback speed (the node feeds frames by their stamps: the same ones at any speed)")
    parser.add_argument("--model-path", default="", help="model directory ('' = the embedded model)")
    parser.add_argument("--params", type=Path, default=default_params_file(), help="node params YAML")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds to wait for answers after the bag ends")
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be positive")
    try:
        run = run_node_on_bag(args.bag, args.rate, args.model_path, args.params, args.grace)
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    if not run.ok:
        return 1
    print(summary_line(run.questions, run.infos, run.correct), flush=True)
    pruning = (run.last_stats or {}).get("pruning") or {}
    if pruning.get("pruned_per_frame"):
        print(f"demo: temporal pruning: {pruning['appended_per_frame']:.1f} tokens appended per frame, "
              f"{pruning['pruned_per_frame']:.1f} left out", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
