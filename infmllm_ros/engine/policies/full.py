"""`full`: never evict. The reference every other policy is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from .base import CachePolicy


@dataclass
class FullCache(CachePolicy):
    """Keeps every token; memory grows with the stream. `budget` is unused; `chunk` is only the
    most tokens one forward appends (long text is fed in pieces of it)."""

    name = "full"

    @property
    def max_length(self) -> float:
        return float("inf")

    def must_evict(self, length: int, incoming: int) -> bool:
        return False
