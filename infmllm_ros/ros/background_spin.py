"""Spin one rclpy node on a thread of its own, so the caller can block and poll (demo, tests)."""

from __future__ import annotations

import threading

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor


class BackgroundSpin:
    """A single-threaded executor for `node` on a daemon thread; `stop()` also shuts its context down."""

    def __init__(self, node, context=None) -> None:
        self.node, self.context = node, context
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except ExternalShutdownException:
            pass

    def stop(self, join_s: float = 5.0) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self._thread.join(join_s)
