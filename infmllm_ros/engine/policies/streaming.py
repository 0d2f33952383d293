"""`streaming`: StreamingLLM (Xiao et al., 2023) — a few attention sinks plus a recent window."""

from __future__ import annotations

from dataclasses import dataclass

from .base import CachePolicy


@dataclass
class StreamingWindow(CachePolicy):
    """Sinks + the newest tokens: everything after the sinks is the window (budget - sink)."""

    sink: int = 4
    name = "streaming"

    @property
    def kept_sink(self) -> int:
        return self.sink

    @property
    def kept_recent(self) -> int:
        return self.budget - self.sink
