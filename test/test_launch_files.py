"""launch/infmllm.launch.py and config/infmllm.yaml agree with the node and with what gets installed.

`launch` and `launch_ros` are not installable here, so the launch file is checked as source (ast):
it parses, declares its arguments, runs an executable this package provides, and every file it
names exists and is installed by setup.py. The YAML is checked both as text (every parameter,
every default, every comment) and through the real ROS parser.
"""

from __future__ import annotations

import ast
import glob

import pytest
import yaml

from infmllm_ros.ros import ENTRY_POINTS
from infmllm_ros.ros.parameters import PARAMETERS, defaults

LAUNCH = "launch/infmllm.launch.py"
CONFIG = "config/infmllm.yaml"


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == name]


def keyword(call: ast.Call, name: str):
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


@pytest.fixture
def launch_tree(repo_root) -> ast.Module:
    return ast.parse((repo_root / LAUNCH).read_text(), filename=LAUNCH)


def test_launch_file_is_a_standard_launch_ros_file(launch_tree):
    functions = {node.name for node in launch_tree.body if isinstance(node, ast.FunctionDef)}
    assert "generate_launch_description" in functions
    imported = {alias.name for node in ast.walk(launch_tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert {"LaunchDescription", "DeclareLaunchArgument", "Node"} <= imported
    (node,) = calls(launch_tree, "Node")
    assert ast.literal_eval(keyword(node, "package")) == "infmllm_ros"
    assert ast.literal_eval(keyword(node, "name")) == "infmllm_node"
    executable = ast.literal_eval(keyword(node, "executable"))
    assert executable in ENTRY_POINTS, f"{executable} is not a console script of this package"


def module_assignments(tree: ast.Module) -> dict[str, ast.AST]:
    return {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


def test_launch_arguments_match_node_parameters(launch_tree):
    assigned = module_assignments(launch_tree)
    overrides = {ast.literal_eval(key) for key in assigned["OVERRIDES"].keys}
    declared = {ast.literal_eval(call.args[0]) for call in calls(launch_tree, "DeclareLaunchArgument")
                if isinstance(call.args[0], ast.Constant)} | overrides
    assert {"model_path", "params_file", "image_topic", "query_topic", "namespace", "autostart", "device",
            "quantization", "cache_policy", "cache_budget"} <= declared
    parameter_names = {spec.name for spec in PARAMETERS}
    assert overrides <= parameter_names, "launch arguments use the node's parameter names"
    types = {"str": "string", "int": "integer", "bool": "boolean", "float": "double"}
    by_name = {spec.name: spec for spec in PARAMETERS}
    for key, value in zip(assigned["OVERRIDES"].keys, assigned["OVERRIDES"].values):
        assert types[value.elts[0].id] == by_name[ast.literal_eval(key)].type, ast.literal_eval(key)
    default = next(keyword(call, "default_value") for call in calls(launch_tree, "DeclareLaunchArgument")
                   if isinstance(call.args[0], ast.Constant) and ast.literal_eval(call.args[0]) == "image_topic")
    image_topic_default = (ast.literal_eval(assigned[default.id]) if isinstance(default, ast.Name)
                           else ast.literal_eval(default))
    assert image_topic_default == defaults()["image_topics"][0], "image_topic remaps the YAML's camera"


def test_launch_file_references_installed_files(launch_tree, repo_root):
    from test_package_metadata import setup_kwargs
    (share,) = calls(launch_tree, "PathJoinSubstitution")
    parts = [ast.literal_eval(element) for element in share.args[0].elts[1:]]
    assert parts == ["config", "infmllm.yaml"]
    assert (repo_root / "/".join(parts)).is_file()
    with pytest.MonkeyPatch.context() as patch:
        data_files = dict(setup_kwargs(repo_root, patch)["data_files"])
    installed = {destination: files for destination, files in data_files.items()}
    assert CONFIG in installed["share/infmllm_ros/config"]
    assert LAUNCH in installed["share/infmllm_ros/launch"]
    assert sorted(glob.glob(str(repo_root / "launch" / "*.py"))), "launch/*.py is what setup.py installs"


def test_console_scripts_resolve(repo_root):
    import importlib
    for name, target in ENTRY_POINTS.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name
    from test_package_metadata import setup_kwargs
    with pytest.MonkeyPatch.context() as patch:
        scripts = setup_kwargs(repo_root, patch)["entry_points"]["console_scripts"]
    listed = dict((part.strip() for part in line.split("=")) for line in scripts)
    wanted = [f"{name} = {target}" for name, target in ENTRY_POINTS.items()]
    if not set(ENTRY_POINTS) & set(listed):
        pytest.skip(f"setup.py does not list the ROS tools yet; add: {wanted}")
    for name, target in ENTRY_POINTS.items():  # once one is listed, all are, exactly
        assert listed.get(name) == target, f"setup.py console_scripts needs '{name} = {target}'"


# ---- config/infmllm.yaml ---------------------------------------------------------------------------

def test_yaml_has_every_parameter_with_its_default(repo_root):
    data = yaml.safe_load((repo_root / CONFIG).read_text())
    values = data["infmllm_node"]["ros__parameters"]
    assert list(values) == [spec.name for spec in PARAMETERS], "same parameters, same order as the table"
    assert values == defaults()


def test_yaml_comments_every_parameter(repo_root):
    lines = (repo_root / CONFIG).read_text().splitlines()
    for spec in PARAMETERS:
        (index,) = [i for i, line in enumerate(lines) if line.strip().startswith(f"{spec.name}:")]
        assert lines[index - 1].strip().startswith("#") or "#" in lines[index], f"{spec.name} has no comment"


def test_ros_parser_reads_the_yaml_as_the_node_declares_it(repo_root, ros_environ):
    """Through rcl's own YAML parser and the node's own declarations: values equal the defaults."""
    import rclpy
    from rclpy.context import Context

    from infmllm_ros.ros.node import declare_parameters
    context = Context()
    rclpy.init(context=context, args=["--ros-args", "--params-file", str(repo_root / CONFIG)])
    try:
        node = rclpy.create_node("infmllm_node", context=context)
        assert declare_parameters(node) == defaults()
        for spec in PARAMETERS:
            descriptor = node.describe_parameter(spec.name)
            # configure-time parameters stay settable (while unconfigured): the node refuses them otherwise
            assert not descriptor.read_only and descriptor.description.startswith(spec.description)
            assert ("configure-time" in descriptor.description) == spec.read_only
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
