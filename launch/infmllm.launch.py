"""Launch infmllm_node with the package's params file, an optional model directory and camera topic.

    ros2 launch infmllm_ros infmllm.launch.py
    ros2 launch infmllm_ros infmllm.launch.py model_path:=/models/llava image_topic:=/front/image_raw
    ros2 launch infmllm_ros infmllm.launch.py params_file:=/my/infmllm.yaml
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

# The topics config/infmllm.yaml subscribes to; image_topic remaps them both.
DEFAULT_IMAGE_TOPIC = "/camera/image_raw"


def _node(context):
    model_path = LaunchConfiguration("model_path").perform(context)
    image_topic = LaunchConfiguration("image_topic").perform(context)
    parameters = [LaunchConfiguration("params_file")]
    if model_path:  # only when given: '' must not override a model_path set in params_file
        parameters.append({"model_path": model_path})
    return [Node(
        package="infmllm_ros",
        executable="infmllm_node",
        name="infmllm_node",
        output="screen",
        emulate_tty=True,
        parameters=parameters,
        remappings=[
            (DEFAULT_IMAGE_TOPIC, image_topic),
            (DEFAULT_IMAGE_TOPIC + "/compressed", image_topic + "/compressed"),
            ("/infmllm_node/query", LaunchConfiguration("query_topic").perform(context)),
        ],
    )]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("infmllm_ros"), "config", "infmllm.yaml"]),
            description="ROS params YAML for infmllm_node"),
        DeclareLaunchArgument(
            "model_path", default_value="",
            description="Hugging Face model directory; '' keeps params_file's (default: the embedded model)"),
        DeclareLaunchArgument(
            "image_topic", default_value=DEFAULT_IMAGE_TOPIC,
            description="camera topic (its /compressed sibling is remapped along with it)"),
        DeclareLaunchArgument(
            "query_topic", default_value="/infmllm_node/query",
            description="topic the questions arrive on"),
        OpaqueFunction(function=_node),
    ])
