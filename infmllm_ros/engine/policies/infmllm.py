"""`infmllm`: Inf-MLLM (Ning et al., 2024, arXiv 2409.09086) — recent tokens plus attention saddles.

Attention saddles are older tokens that keep receiving high attention from recent queries. The
paper publishes no code, so each choice below is our reading of it (see ../shared/inf-mllm.md):

- Retrieval window: the queries of every forward since the previous eviction (a frame, a prompt,
  decoded tokens): at most `chunk` tokens, the most recent context by construction.
- Local sum: the window's attention mass can be summed over a neighbourhood of `pool` keys, so a
  cluster of relevant tokens survives together, not as scattered single tokens. Sum pooling, as
  SnapKV's observation-window pooling, but in stream order. Off by default (pool 1): on the
  embedded model, whose object is one or two of a frame's patches, a sum over 5 neighbours cost
  answers about objects seen minutes ago 3-9 points at 5-10 % budgets and bought no other family
  anything beyond the intervals (`infmllm-bench --suite saddles`, README Results 2d). A model whose
  objects span many consecutive tokens may want it back.
- Attention bias: accumulated saddle evidence decays by `attention_bias` each eviction round, so
  when a new prompt or new frames move attention forward, the cache follows instead of freezing
  on old saddles. 0 keeps evidence forever (H2O-like memory); 1 uses only the last window.
- Sinks: kept (4 by default). StreamingLLM showed that the first tokens absorb attention mass
  regardless of content; evicting them perturbs every later softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import CachePolicy


@dataclass
class AttentionSaddles(CachePolicy):
    """Recent window + sinks + the candidates with the highest local sum of windowed attention."""

    sink: int = 4
    recent: int = 128
    pool: int = 1          # the local sum's width in keys (odd); 1 = each key on its own
    attention_bias: float = 0.2

    name = "infmllm"
    needs_attention_mass = True

    @property
    def kept_sink(self) -> int:
        return self.sink

    @property
    def kept_recent(self) -> int:
        return self.recent

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool < 1 or self.pool % 2 == 0:
            raise ValueError(f"pool must be a positive odd number of keys, got {self.pool}")
        if not 0.0 <= self.attention_bias <= 1.0:
            raise ValueError(f"attention_bias must lie in [0, 1], got {self.attention_bias}")

    def importance(self, attention_mass: torch.Tensor | None, length: int, kv_heads: int) -> torch.Tensor:
        return local_sum(attention_mass.float(), self.pool)

    def after_eviction(self, running: torch.Tensor) -> torch.Tensor:
        return running * (1.0 - self.attention_bias)


def local_sum(mass: torch.Tensor, width: int) -> torch.Tensor:
    """Sum of `mass` over a centred window of `width` neighbouring keys (zero-padded)."""
    if width == 1:
        return mass
    kernel = torch.ones(1, 1, width, dtype=mass.dtype, device=mass.device)
    return F.conv1d(mass.unsqueeze(1), kernel, padding=width // 2).squeeze(1)
