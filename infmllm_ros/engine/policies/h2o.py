"""`h2o`: Heavy-Hitter Oracle (Zhang et al., 2023) — keep the keys with the most accumulated
attention plus a recent window."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CachePolicy


@dataclass
class HeavyHitters(CachePolicy):
    """Importance is the attention mass a key has received from every query since it arrived,
    summed without decay (as in the paper), per KV head over its query-head group."""

    recent: int = 256

    name = "h2o"
    needs_attention_mass = True

    @property
    def kept_recent(self) -> int:
        return self.recent

    def importance(self, attention_mass: torch.Tensor | None, length: int, kv_heads: int) -> torch.Tensor:
        return attention_mass
