"""`infmllm-run --params config/infmllm.yaml [--ros-args ...]`: the node, from a ROS params YAML.

The file goes to rclpy as `--ros-args --params-file`, so the real ROS parser reads it (types,
node-name sections, wildcards) exactly as `ros2 run` or a launch file would. It is also read here
once, only to refuse keys the node does not declare: ROS ignores those silently, and a misspelt
parameter that does nothing is the hardest kind of bug to see.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import yaml

from .parameters import BY_NAME

NODE_NAME = "infmllm_node"  # the YAML section; same as node.NODE_NAME (not imported: that loads torch)
PARAMS_FILE = "infmllm.yaml"


def default_params_file() -> Path:
    """The repository's config/infmllm.yaml when running from source, else the installed share one."""
    source = Path(__file__).resolve().parents[2] / "config" / PARAMS_FILE
    if source.is_file():
        return source
    try:
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory("infmllm_ros")) / "config" / PARAMS_FILE
    except (ImportError, LookupError):
        return source


def node_parameters(path: Path) -> dict:
    """The ros__parameters of the node's sections (`infmllm_node:` and `/**:`) of a params file, merged."""
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a ROS params file (expected `{NODE_NAME}: ros__parameters: ...`)")
    sections = [body for name, body in data.items() if str(name).lstrip("/") in (NODE_NAME, "**")]
    if not sections:
        raise ValueError(f"{path}: no `{NODE_NAME}:` (or `/**:`) section")
    merged = {}
    for body in sections:
        params = (body or {}).get("ros__parameters")
        if not isinstance(params, dict):
            raise ValueError(f"{path}: the {NODE_NAME} section has no ros__parameters mapping")
        merged.update(params)
    return merged


def unknown_keys(path: Path) -> list[str]:
    """Parameters in the node's sections of a params file that the node does not declare."""
    return [name for name in node_parameters(path) if name not in BY_NAME and name != "use_sim_time"]


def node_arguments(params: Path, ros_args: Sequence[str]) -> list[str]:
    """rclpy argv: the params file first, so `-p name:=value` given after it wins."""
    return [NODE_NAME, "--ros-args", "--params-file", str(params), *ros_args]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ros_args = argv[argv.index("--ros-args") + 1:] if "--ros-args" in argv else []
    own = argv[:argv.index("--ros-args")] if "--ros-args" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Anything after --ros-args goes to ROS (e.g. -p name:=value, -r from:=to).")
    parser.add_argument("--params", type=Path, default=default_params_file(), help="ROS params YAML")
    args = parser.parse_args(own)
    try:
        if not args.params.is_file():
            raise ValueError(f"params file {args.params} does not exist")
        unknown = unknown_keys(args.params)
    except (ValueError, yaml.YAMLError) as error:
        print(f"infmllm-run: error: {error}", file=sys.stderr)
        return 2
    if unknown:
        print(f"infmllm-run: error: {args.params} sets parameters the node does not have: {unknown} "
              f"(known: {sorted(BY_NAME)})", file=sys.stderr)
        return 2
    from .node import main as node_main  # here: importing the node loads torch
    return node_main(node_arguments(args.params, ros_args))


if __name__ == "__main__":
    sys.exit(main())
