"""package.xml, setup.py and the files on disk agree: what colcon installs is what exists."""

from __future__ import annotations

import ast
import runpy
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import setuptools


def setup_call_keywords(repo_root: Path) -> dict[str, ast.expr]:
    tree = ast.parse((repo_root / "setup.py").read_text())
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup"]
    assert len(calls) == 1
    return {kw.arg: kw.value for kw in calls[0].keywords}


def setup_kwargs(repo_root: Path, monkeypatch) -> dict:
    """Run setup.py as colcon would, but capture the arguments instead of building."""
    captured: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(repo_root)
    runpy.run_path(str(repo_root / "setup.py"), run_name="__main__")
    return captured


def test_package_xml_is_format_3_ament_python(repo_root):
    root = ET.parse(repo_root / "package.xml").getroot()
    assert root.tag == "package" and root.get("format") == "3"
    assert root.findtext("name") == "infmllm_ros"
    assert root.find("export/build_type").text == "ament_python"
    exec_depends = {element.text for element in root.findall("exec_depend")}
    assert {"rclpy", "sensor_msgs", "std_msgs", "cv_bridge", "python3-opencv", "python3-numpy"} <= exec_depends
    assert root.findall("test_depend"), "ROS packages list their test dependencies"
    assert root.findtext("license") and root.find("maintainer").get("email")


def test_setup_py_version_and_name_match_package_xml(repo_root):
    root = ET.parse(repo_root / "package.xml").getroot()
    keywords = setup_call_keywords(repo_root)
    assert ast.literal_eval(keywords["version"]) == root.findtext("version")
    assert (repo_root / "resource" / root.findtext("name")).is_file(), "ament index marker"


def test_setup_cfg_puts_scripts_where_ros2_run_looks(repo_root):
    text = (repo_root / "setup.cfg").read_text()
    assert "script_dir=$base/lib/infmllm_ros" in text
    assert "install_scripts=$base/lib/infmllm_ros" in text


def test_installed_share_files_exist(repo_root, monkeypatch):
    """Every data file setup.py names exists, and launch/config are installed under share/."""
    captured = setup_kwargs(repo_root, monkeypatch)
    destinations = dict(captured["data_files"])
    assert destinations["share/ament_index/resource_index/packages"] == ["resource/infmllm_ros"]
    assert destinations["share/infmllm_ros"] == ["package.xml"]
    for destination, files in captured["data_files"]:
        for name in files:
            assert (repo_root / name).is_file(), f"{name} (for {destination}) is missing"
    assert "config/fastdds_shm.xml" in destinations["share/infmllm_ros/config"]
    assert "infmllm_ros.kernels" in captured["packages"]
    assert "kernels" not in captured["packages"]
    for script in captured["entry_points"]["console_scripts"]:
        name, target = (part.strip() for part in script.split("="))
        module, _, function = target.partition(":")
        imported = __import__(module, fromlist=[function])
        assert callable(getattr(imported, function)), f"{name} -> {target} is not callable"


def test_kernels_import_inside_package_namespace(tmp_path):
    """Installed, kernels/ is `infmllm_ros.kernels`; no bare top-level `kernels` module leaks.

    Run from an unrelated directory: `python -m pytest` puts the repo root on sys.path, where a
    bare `kernels` directory would always be importable.
    """
    probe = ("import importlib.util, infmllm_ros.kernels as k; "
             "print(k.__name__, importlib.util.find_spec('kernels') is None)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                            text=True, check=True)
    assert result.stdout.split() == ["infmllm_ros.kernels", "True"]


def test_colcon_style_install_into_a_prefix(repo_root, tmp_path):
    """What `colcon build` does for an ament_python package (setup.py build + install --prefix),
    then the installed entry points and share/ files used from that prefix, away from the source."""
    source = tmp_path / "src"
    source.mkdir()
    # the tracked files only, as a clone on the robot has them (not this checkout's build outputs)
    subprocess.run(f"git -C {repo_root} ls-files -z | (cd {repo_root} && xargs -0 cp --parents -t {source})",
                   shell=True, check=True, executable="/bin/bash")
    prefix = tmp_path / "install"
    subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(tmp_path / "build"), "install",
                    "--prefix", str(prefix), "--single-version-externally-managed", "--record",
                    str(tmp_path / "record.txt")], cwd=source, check=True, capture_output=True, text=True)
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    share = prefix / "share" / "infmllm_ros"
    for name in ("package.xml", "launch/infmllm.launch.py", "config/infmllm.yaml", "config/fastdds_shm.xml"):
        assert (share / name).is_file(), name
    assert (prefix / "share/ament_index/resource_index/packages/infmllm_ros").is_file()
    assert (site / "infmllm_ros/models/tiny_llava/model.safetensors").is_file(), "the embedded model is installed"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(site),
           "AMENT_PREFIX_PATH": str(prefix), "HOME": str(tmp_path)}
    probe = ("import infmllm_ros, infmllm_ros.ros.run as run; "
             "print(infmllm_ros.__file__); print(run.default_params_file())")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    module_file, params = result.stdout.split()
    assert module_file.startswith(str(site)), "imported from the install, not the source tree"
    assert params == str(share / "config" / "infmllm.yaml"), "the installed params file is the default"
    scripts = prefix / "lib" / "infmllm_ros"   # where `ros2 run infmllm_ros ...` looks
    result = subprocess.run([str(scripts / "infmllm-run"), "--help"], cwd=tmp_path, env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0 and "--params" in result.stdout, result.stderr


def test_robot_requirements_leave_apts_packages_alone(repo_root):
    """On a robot, pip must not replace what apt's ROS is built against (cv_bridge and numpy, colcon
    and setuptools), nor install rclpy or a torch that is not the robot's CUDA build."""
    names = {line.split("==")[0].strip().lower() for line in (repo_root / "requirements-robot.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    assert {"transformers", "bitsandbytes"} <= names
    assert not names & {"numpy", "opencv-python", "opencv-python-headless", "pyyaml", "setuptools", "torch"}
    assert not any(name.startswith("ros-") or name == "rclpy" for name in names)
