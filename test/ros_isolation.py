"""Give each rclpy test its own DDS domain so parallel test runs never see each other.

A domain id is claimed by holding an exclusive lock on a per-id file under the temp dir; another
run (or another pytest worker) that finds the lock held moves on to the next id. Discovery is
restricted to localhost, so nothing a test publishes leaves this machine.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# Fast DDS derives UDP ports from the domain id; 1..100 stay clear of the ephemeral port range.
_DOMAIN_IDS = range(1, 101)
_LOCK_DIR = Path(tempfile.gettempdir()) / "infmllm_ros_domain_locks"


@contextmanager
def claimed_domain_id() -> Iterator[int]:
    """Yield a ROS domain id no other process on this machine holds, for as long as the block runs."""
    _LOCK_DIR.mkdir(exist_ok=True)
    start = os.getpid() % len(_DOMAIN_IDS)
    order = list(_DOMAIN_IDS)[start:] + list(_DOMAIN_IDS)[:start]
    for domain_id in order:
        handle = open(_LOCK_DIR / f"{domain_id}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield domain_id
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        return
    raise RuntimeError("no free ROS domain id in 1..100 on this machine")


def isolated_ros_environ(domain_id: int) -> dict[str, str]:
    """The variables every rclpy process of one test must share."""
    return {
        "ROS_DOMAIN_ID": str(domain_id),
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        "ROS_LOCALHOST_ONLY": "1",  # honoured by Humble, ignored (deprecated) by newer distros
        "RMW_IMPLEMENTATION": os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp"),
    }
