"""infmllm_ros: a ROS 2 perception node with a bounded Inf-MLLM KV cache."""

__version__ = "0.1.0"
