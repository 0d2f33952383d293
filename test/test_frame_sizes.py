"""Real checkpoints' frame sizes with the shipped defaults: the cache is sized from the model's
tokens per frame, so a Qwen2-VL frame of 640x480 (396 tokens) or a SmolVLM one (70) is fed, not
rejected; and an explicit size that can never take a frame fails at configure, in one line.

Model directories are random-weight instances of the real families whose processors have the
real checkpoints' image limits (Qwen2-VL-2B-Instruct's pixel range, SmolVLM-256M's 512 px image of
64 tokens), written and loaded like real checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.testing.tiny_models import save
from node_helpers import NodeListener, NodeProcess, module_ros_environ, rgb_image_msg, wait_until  # noqa: F401

CAMERA = "/real/cam"
FRAME = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def real_size_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("real_frame_size")
    return {family: save(family, root / family, real_frame_size=True) for family in ("qwen2_vl", "idefics3")}


def test_auto_sizes_are_frames_of_the_model(real_size_dirs):
    embedded = StreamingSession(SessionConfig())
    assert (embedded.config.cache_budget, embedded.config.recent_window, embedded.config.eviction_chunk) == (
        1024, 256, 64)   # the sizes every figure of the embedded model was measured with
    qwen = StreamingSession(SessionConfig(model_path=str(real_size_dirs["qwen2_vl"])))
    frame = qwen.frame_tokens
    assert frame > 300   # the 396: far more than the old fixed chunk of 64
    assert (qwen.config.cache_budget, qwen.config.recent_window, qwen.config.eviction_chunk) == (
        16 * frame, 4 * frame, frame)
    for _ in range(20):   # past the budget: evictions happen, every frame is taken
        qwen.add_frame(FRAME)
        assert qwen.cache.length <= qwen.policy.max_length
    assert qwen.frames_seen == 20 and qwen.cache.length < 20 * frame
    assert qwen.ask("what is in view?").frames_seen == 20


def test_a_chunk_smaller_than_a_frame_is_a_configuration_error(real_size_dirs):
    with pytest.raises(ValueError, match=r"^one 640x480 frame is \d+ tokens of this model, more than "
                                         r"eviction_chunk \(64\)"):
        StreamingSession(SessionConfig(model_path=str(real_size_dirs["qwen2_vl"]), eviction_chunk=64))
    full = StreamingSession(SessionConfig(model_path=str(real_size_dirs["qwen2_vl"]), cache_policy="full",
                                          eviction_chunk=64))   # full never evicts: no chunk to fit
    full.add_frame(FRAME)


@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3"])
def test_node_with_shipped_defaults_feeds_real_size_frames(module_ros_environ, real_size_dirs, family):
    """The issue's run: a real-shaped model under config/infmllm.yaml's sizes, 640x480 frames over DDS."""
    from sensor_msgs.msg import Image
    node = NodeProcess(module_ros_environ, {"model_path": str(real_size_dirs[family]), "image_topics": [CAMERA],
                                            "stats_period_s": 0.3, "image_qos": "reliable"})
    listener = NodeListener(name=f"frame_size_{family}")
    try:
        listener.wait_ready(node)
        assert "frames of" in node.stderr()   # the configure line says what the auto sizes came to
        publisher = listener.publisher(CAMERA, Image)

        def fed() -> int:
            return listener.copy("stats")[-1]["cameras"].get(CAMERA, {}).get("fed", 0)
        # a camera keeps publishing; a frame lost while DDS completes the match is simply followed
        for index in range(40):
            message = rgb_image_msg(FRAME)
            message.header.stamp.sec = 1_000 + 2 * index   # due at 1 Hz of stamp time: each is fed
            publisher.publish(message)
            if wait_until(lambda: fed() >= 2, 1.5):
                break
        assert fed() >= 2, node.stderr()
        listener.ask("what is in view?", "size-1")
        info = listener.info_for("size-1", timeout=60)
        assert info is not None and info["status"] == "ok" and info["frames_seen"] >= 2, info
        assert listener.copy("stats")[-1]["cameras"][CAMERA].get("bad", 0) == 0
    finally:
        listener.close()
        assert node.stop() == 0, node.stderr()


def test_node_with_a_chunk_below_one_frame_says_so_at_configure(module_ros_environ, real_size_dirs):
    node = NodeProcess(module_ros_environ, {"model_path": str(real_size_dirs["qwen2_vl"]), "image_topics": [CAMERA],
                                            "eviction_chunk": 64})
    try:
        reason = wait_until(lambda: "configure failed" in node.stderr() and node.stderr(), 90)
        assert reason and "more than eviction_chunk (64)" in reason, node.stderr()
        assert node.alive()   # unconfigured, waiting for a fixed parameter
    finally:
        node.stop()
