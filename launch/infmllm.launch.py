"""Launch infmllm_node with the package's params file; the common settings as launch arguments.

    ros2 launch infmllm_ros infmllm.launch.py
    ros2 launch infmllm_ros infmllm.launch.py model_path:=/models/llava image_topic:=/front/image_raw
    ros2 launch infmllm_ros infmllm.launch.py params_file:=/my/infmllm.yaml namespace:=robot1
    ros2 launch infmllm_ros infmllm.launch.py autostart:=false   # for a lifecycle manager

An argument left at '' keeps what params_file says, so the YAML stays the one place for settings.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

# The topics config/infmllm.yaml subscribes to; image_topic remaps them both.
DEFAULT_IMAGE_TOPIC = "/camera/image_raw"
# Node parameters that may be given as launch arguments: name -> (type, description).
OVERRIDES = {
    "model_path": (str, "Hugging Face model directory (default: the embedded model)"),
    "device": (str, "torch device: cpu, cuda or cuda:N"),
    "quantization": (str, "none, nf4, int8, cpu-int8 or auto"),
    "cache_policy": (str, "full, streaming, h2o or infmllm"),
    "cache_budget": (int, "tokens kept per layer after an eviction (0 = auto: 16 frames of the model)"),
    "autostart": (bool, "true: walk to active at start; false: stay unconfigured for a lifecycle manager"),
}


def _typed(kind, text: str):
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"expected true or false, got {text!r}")
        return text.lower() == "true"
    return kind(text)


def _node(context):
    parameters = [LaunchConfiguration("params_file")]
    given = {name: LaunchConfiguration(name).perform(context) for name in OVERRIDES}
    # only the ones given: '' must not override what params_file sets
    parameters.append({name: _typed(OVERRIDES[name][0], value) for name, value in given.items() if value != ""})
    image_topic = LaunchConfiguration("image_topic").perform(context)
    return [Node(
        package="infmllm_ros",
        executable="infmllm_node",
        name="infmllm_node",
        namespace=LaunchConfiguration("namespace").perform(context),
        output="screen",
        emulate_tty=True,
        parameters=parameters,
        remappings=[
            (DEFAULT_IMAGE_TOPIC, image_topic),
            (DEFAULT_IMAGE_TOPIC + "/compressed", image_topic + "/compressed"),
            # "~/" so the remap still matches under a namespace
            ("~/query", LaunchConfiguration("query_topic").perform(context) or "~/query"),
        ],
    )]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("infmllm_ros"), "config", "infmllm.yaml"]),
            description="ROS params YAML for infmllm_node"),
        *[DeclareLaunchArgument(name, default_value="", description=f"{text}; '' keeps params_file's")
          for name, (_, text) in OVERRIDES.items()],
        DeclareLaunchArgument(
            "image_topic", default_value=DEFAULT_IMAGE_TOPIC,
            description="camera topic (its /compressed sibling is remapped along with it)"),
        DeclareLaunchArgument(
            "query_topic", default_value="",
            description="topic the questions arrive on ('' = the node's own ~/query)"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        OpaqueFunction(function=_node),
    ])
