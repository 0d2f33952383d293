"""Helpers and fixtures for the node's DDS tests: model directories, node processes, a listener.

Import the fixtures into a test module with `from node_helpers import *` (pytest finds them there).
The node always runs in its own process and the listener in this one, so every message crosses
real DDS; nothing of rclpy or the engine is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from infmllm_ros.models import embedded_model_path
from ros_isolation import claimed_domain_id, isolated_ros_environ

REPO_ROOT = Path(__file__).resolve().parent.parent
# Which model the node tests run on: the trained embedded one when present, else a random one
# whose answers are nonsense (the accuracy floor switches on this).
EMBEDDED = (embedded_model_path() / "config.json").is_file()
NODE_START_TIMEOUT_S = 90.0  # torch + model load on 2 busy cores


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """The first truthy value of condition() within timeout seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


# ---- model directories ------------------------------------------------------------------------

def save_babbling_model(directory: Path) -> Path:
    """A tiny LLaVA that answers 'red red red ...' and never stops: a real model for long answers.

    Attention and MLP outputs are zeroed and every token embedding is the same vector, so the last
    hidden state is one constant; the LM-head row of 'red' is set along it, so 'red' always wins
    and no stop token is ever produced.
    """
    import torch

    from infmllm_ros.testing.tiny_models import build
    model, processor = build("llava-llama", seed=1)
    text_model = model.model.language_model
    with torch.no_grad():
        for layer in text_model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = text_model.embed_tokens.weight
        embeddings[:] = embeddings[0].clone()
        hidden = text_model.norm(embeddings[0][None, None])[0, 0]
        model.lm_head.weight.mul_(0.01)
        model.lm_head.weight[processor.tokenizer.convert_tokens_to_ids("red")] = hidden / hidden.norm() * 10
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def save_wide_model(directory: Path, width: int = 768, layers: int = 6) -> Path:
    """A random LLaVA whose language model is ~130 MB in fp32: large enough that the memory a node
    holds for it, and gives back on cleanup, stands out of the process's other allocations."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    from infmllm_ros.testing.tiny_models import build
    small, processor = build("llava-llama", seed=3)
    config = small.config.to_dict()
    config["text_config"].update(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers)
    LlavaForConditionalGeneration(LlavaConfig(**config)).save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def node_model_dir(tmp_path_factory) -> Path:
    """The embedded model if it has been trained, else a tiny random LLaVA."""
    if EMBEDDED:
        return embedded_model_path()
    from infmllm_ros.testing.tiny_models import save
    return save("llava-llama", tmp_path_factory.mktemp("random_llava"))


@pytest.fixture(scope="session")
def babbling_model_dir(tmp_path_factory) -> Path:
    return save_babbling_model(tmp_path_factory.mktemp("babbling_llava"))


@pytest.fixture(scope="module")
def module_ros_environ() -> dict[str, str]:
    """conftest's ros_environ, for a whole module: one domain shared by a module's node and tests."""
    with claimed_domain_id() as domain_id, pytest.MonkeyPatch.context() as patch:
        for key, value in isolated_ros_environ(domain_id).items():
            patch.setenv(key, value)
        yield dict(os.environ)


# ---- processes --------------------------------------------------------------------------------

def ros_param(name: str, value: Any) -> list[str]:
    """`-p name:=value` for the rcl command line (YAML values)."""
    if isinstance(value, (list, tuple)):
        value = "[" + ",".join(value) + "]"
    elif isinstance(value, bool):
        value = str(value).lower()
    return ["-p", f"{name}:={value}"]


class NodeProcess:
    """`python -m infmllm_ros.ros.node` in its own process; stderr goes to a file (no pipe to fill)."""

    def __init__(self, env: dict[str, str], params: dict[str, Any], namespace: str = "") -> None:
        command = [sys.executable, "-m", "infmllm_ros.ros.node", "--ros-args"]
        if namespace:
            command += ["-r", f"__ns:={namespace}"]
        for name, value in params.items():
            command += ros_param(name, value)
        self._stderr = tempfile.TemporaryFile(mode="w+")
        # One torch thread: on a shared 2-core machine, OpenMP threads of a tiny model contend with
        # every other process and make each forward ~50x slower (measured); one thread does not.
        env = {"OMP_NUM_THREADS": "1", **env}
        self.process = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                                        stderr=self._stderr, text=True)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGINT, as Ctrl-C would; returns the exit code (kills after timeout)."""
        if self.alive():
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9


def run_module(module: str, *args: str, env: dict[str, str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


# ---- the listener: this process's end of DDS ---------------------------------------------------

class NodeListener:
    """Records everything the node publishes and sends it queries and images, over DDS.

    Its own rclpy Context and executor thread, so the test body can block and poll freely.
    """

    def __init__(self, node_name: str = "/infmllm_node", name: str = "test_listener") -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        from std_msgs.msg import String

        from infmllm_ros.ros.background_spin import BackgroundSpin

        self.prefix = node_name
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(name, context=self.context)
        self._lock = threading.Lock()
        self.answers: list[str] = []
        self.pieces: list[str] = []
        self.infos: list[dict] = []
        self.stats: list[dict] = []
        reliable = QoSProfile(depth=2000, reliability=QoSReliabilityPolicy.RELIABLE)
        for topic, sink, parse in (("answer", self.answers, None), ("answer_stream", self.pieces, None),
                                   ("answer_info", self.infos, json.loads), ("stats", self.stats, json.loads)):
            self.node.create_subscription(String, f"{node_name}/{topic}", self._recorder(sink, parse), reliable)
        self.query_publisher = self.node.create_publisher(String, f"{node_name}/query", reliable)
        self._publishers: dict[str, Any] = {}
        self._spin = BackgroundSpin(self.node, self.context)

    def _recorder(self, sink: list, parse):
        def record(msg) -> None:
            with self._lock:
                sink.append(parse(msg.data) if parse else msg.data)
        return record

    def copy(self, name: str) -> list:
        with self._lock:
            return list(getattr(self, name))

    # ---- sending ----

    def publisher(self, topic: str, msg_type, reliable: bool = True):
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        if topic not in self._publishers:
            policy = QoSReliabilityPolicy.RELIABLE if reliable else QoSReliabilityPolicy.BEST_EFFORT
            self._publishers[topic] = self.node.create_publisher(msg_type, topic, QoSProfile(depth=50,
                                                                                           reliability=policy))
        publisher = self._publishers[topic]
        assert wait_until(lambda: publisher.get_subscription_count() > 0, 20.0), f"nobody subscribes to {topic}"
        return publisher

    def ask(self, question: str, query_id: str | int | None = None, camera: str | None = None) -> None:
        from std_msgs.msg import String
        query = {"id": query_id, "question": question} if query_id is not None else None
        if camera is not None:
            query = {**(query or {"question": question}), "camera": camera}
        self.query_publisher.publish(String(data=question if query is None else json.dumps(query)))

    def send_raw_query(self, serialized: bytes) -> None:
        self.query_publisher.publish(serialized)

    # ---- waiting ----

    def wait_ready(self, node: NodeProcess, timeout: float = NODE_START_TIMEOUT_S) -> None:
        """Until the node's first stats arrive and it subscribes to our queries."""
        ready = wait_until(lambda: not node.alive() or (self.copy("stats") and
                                                         self.query_publisher.get_subscription_count() > 0),
                           timeout)
        assert node.alive() and ready, f"node did not come up:\n{node.stderr()}"

    def info_for(self, query_id: str, timeout: float = 30.0) -> dict | None:
        def find():
            return next((info for info in self.copy("infos") if info["id"] == query_id), None)
        return wait_until(find, timeout)

    def latest_stats(self, timeout: float = 10.0, after: float | None = None) -> dict:
        """The newest stats message (one published after `after`, a node-side time.time(), if given)."""
        def newest():
            stats = self.copy("stats")
            if stats and (after is None or stats[-1]["stamp"] > after):
                return stats[-1]
            return None
        found = wait_until(newest, timeout)
        assert found, "no ~/stats"
        return found

    def close(self) -> None:
        self._spin.stop()


def rgb_image_msg(rgb: np.ndarray, encoding: str = "rgb8"):
    """A sensor_msgs/Image holding `rgb` in `encoding` (one of the five the node reads)."""
    from sensor_msgs.msg import Image
    pixels = {"rgb8": rgb, "bgr8": rgb[..., ::-1],
              "rgba8": np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)]),
              "bgra8": np.dstack([rgb[..., ::-1], np.full(rgb.shape[:2], 255, np.uint8)]),
              "mono8": rgb[..., 0]}[encoding]
    pixels = np.ascontiguousarray(pixels)
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    msg = Image(height=rgb.shape[0], width=rgb.shape[1], encoding=encoding, is_bigendian=0,
                step=rgb.shape[1] * channels)
    msg.data = pixels.tobytes()
    return msg


__all__ = ["EMBEDDED", "NODE_START_TIMEOUT_S", "NodeListener", "NodeProcess", "REPO_ROOT", "babbling_model_dir",
           "module_ros_environ", "node_model_dir", "rgb_image_msg", "ros_param", "run_module",
           "save_babbling_model", "save_wide_model", "wait_until"]
