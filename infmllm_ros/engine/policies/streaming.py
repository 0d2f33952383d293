"""`streaming`: StreamingLLM (Xiao et al., 2023) — a few attention sinks plus a recent window."""

from __future__ import annotations

from dataclasses import dataclass

from .base import CachePolicy


@dataclass
class StreamingWindow(CachePolicy):
    """Sinks + the newest tokens. The base class keeps the newest candidates when no score is
    given, so the window is simply everything after the sinks: recent = budget - sink."""

    sink: int = 4
    name = "streaming"

    def __post_init__(self) -> None:
        self.recent = self.budget - self.sink
        super().__post_init__()
