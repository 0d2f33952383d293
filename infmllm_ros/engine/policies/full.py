"""`full`: never evict. The reference every other policy is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from .base import CachePolicy


@dataclass
class FullCache(CachePolicy):
    """Keeps every token; memory grows with the stream. budget/chunk are ignored."""

    name = "full"

    def __post_init__(self) -> None:
        self.sink = 0
        self.recent = 0

    @property
    def max_length(self) -> float:
        return float("inf")

    def must_evict(self, length: int, incoming: int) -> bool:
        return False
