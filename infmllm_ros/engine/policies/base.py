"""What every cache policy shares: a budget, protected regions, and one way to pick survivors.

A policy only says *which tokens matter* (`importance`); `keep_indices` does the eviction
arithmetic once for all of them (kvpress's scorer/press split). Policies know nothing of models,
attention internals or ROS: they see one layer's token count and, if they ask for it, the
attention mass each cached key has received.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CachePolicy:
    """Per-layer KV budget with amortised eviction. A policy's dataclass fields are its settings
    (`make_policy` passes each policy only the settings it has).

    budget: cached tokens per layer (per KV head) right after an eviction.
    chunk: how far past the budget the cache may grow before the next eviction; eviction is
        amortised over `chunk` tokens, so the cache never holds more than budget + chunk. It is
        also the most tokens one forward appends.
    """

    budget: int = 1024
    chunk: int = 64

    name = "base"
    #: Whether the cache must collect per-key attention mass (scoring attention) for this policy.
    needs_attention_mass = False

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")
        sink, recent = self.kept_sink, self.kept_recent
        if sink < 0 or recent < 0:
            raise ValueError("sink and recent must be >= 0")
        if self.budget < sink + recent:
            raise ValueError(f"budget ({self.budget}) must hold sink ({sink}) + recent ({recent}) tokens")

    @property
    def kept_sink(self) -> int:
        """The first tokens of the stream, always kept (StreamingLLM's attention sinks); none here."""
        return 0

    @property
    def kept_recent(self) -> int:
        """The newest tokens, always kept (their attention has barely been observed); none here."""
        return 0

    @property
    def max_length(self) -> int:
        """The most tokens a layer may ever hold: the structural bound tests check."""
        return self.budget + self.chunk

    def must_evict(self, length: int, incoming: int) -> bool:
        """True when adding `incoming` tokens would pass budget + chunk."""
        return length + incoming > self.max_length

    def importance(self, attention_mass: torch.Tensor | None, length: int, kv_heads: int) -> torch.Tensor | None:
        """Score per (kv_head, token) for the tokens outside sink and recent; higher survives.

        Return None to keep the newest candidates (a pure window).
        """
        return None

    def fold_mass(self, running: torch.Tensor, new_mass: torch.Tensor) -> torch.Tensor:
        """Combine the mass one forward produced with what the layer had accumulated."""
        return running + new_mass

    def after_eviction(self, running: torch.Tensor) -> torch.Tensor:
        """Adjust the surviving accumulated mass once an eviction round is over."""
        return running

    def keep_indices(self, attention_mass: torch.Tensor | None, length: int, kv_heads: int) -> torch.Tensor:
        """Sorted slot indices to keep, shape (kv_heads, budget), when `length` > budget.

        Sinks and the recent window are always kept; the rest of the budget goes to the
        highest-importance candidates, chosen independently per KV head.
        """
        if length <= self.budget:
            return torch.arange(length).expand(kv_heads, length)
        device = attention_mass.device if attention_mass is not None else None
        sink = torch.arange(min(self.kept_sink, length), device=device)
        recent = torch.arange(max(length - self.kept_recent, self.kept_sink), length, device=device)
        free = self.budget - sink.numel() - recent.numel()
        candidates = torch.arange(sink.numel(), length - recent.numel(), device=device)
        score = self.importance(attention_mass, length, kv_heads)
        if score is None:
            chosen = candidates[candidates.numel() - free:].expand(kv_heads, free)
        else:
            # Newest first plus a stable sort: ties go to the newer token, since with equal
            # evidence newer context is the better bet (and all-zero scores act as a window).
            newest_first = candidates.flip(0)
            order = torch.sort(score[:, newest_first].float(), dim=-1, descending=True, stable=True).indices
            chosen = newest_first[order[:, :free]]
        keep = torch.cat([sink.expand(kv_heads, -1), chosen, recent.expand(kv_heads, -1)], dim=-1)
        return keep.sort(dim=-1).values
