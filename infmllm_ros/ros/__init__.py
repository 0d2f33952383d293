"""The ROS 2 side: the node, its parameters, message conversion, and the run/replay/demo tools.

Nothing under infmllm_ros.engine imports from here: arrows go node -> engine.
"""

# Console scripts this package provides (setup.py's entry_points list the same lines).
ENTRY_POINTS = {
    "infmllm_node": "infmllm_ros.ros.node:main",
    "infmllm-run": "infmllm_ros.ros.run:main",
    "infmllm-replay": "infmllm_ros.ros.replay:main",
    "infmllm-demo": "infmllm_ros.ros.demo:main",
}
