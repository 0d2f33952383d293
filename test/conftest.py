"""Shared fixtures: ROS isolation and the repository paths tests read."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Triton reads this when it is first imported, and transformers/bitsandbytes import it early once it
# is installed: set it before anything else so the kernel tests run on Triton's CPU interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ros_isolation import claimed_domain_id, isolated_ros_environ  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def ros_environ(monkeypatch) -> dict[str, str]:
    """A full environment for rclpy processes of this test: own domain id, localhost discovery.

    It is also applied to this process, so an in-process `rclpy.init()` joins the same domain.
    """
    with claimed_domain_id() as domain_id:
        for key, value in isolated_ros_environ(domain_id).items():
            monkeypatch.setenv(key, value)
        yield dict(os.environ)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """One saved random-weight model directory per supported family."""
    from infmllm_ros.testing.tiny_models import FAMILIES, save
    root = tmp_path_factory.mktemp("tiny_models")
    return {family: save(family, root / family) for family in FAMILIES}
