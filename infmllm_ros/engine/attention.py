"""The attention function that scores keys while it attends, registered with transformers.

H2O and Inf-MLLM need the attention mass every cached key receives. transformers only returns
attention weights from eager attention (the full matrix, for every layer); instead we register
`infmllm_scoring` with `AttentionInterface`: it computes the same attention in query blocks and
hands each layer's per-key mass to the cache that asked for it. A matching entry in
`AttentionMaskInterface` is required, or transformers builds no mask for an unknown name.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

from infmllm_ros.kernels import attention_with_key_mass

SCORING_ATTENTION = "infmllm_scoring"

# The cache collecting mass during the current forward. A context variable rather than a module
# attribute: the model is shared code, and each thread's forward must feed its own cache.
_collector: ContextVar = ContextVar("infmllm_mass_collector", default=None)


@contextmanager
def collecting_attention_mass(cache) -> Iterator[None]:
    """Route per-key attention mass of forwards run inside the block to `cache`."""
    token = _collector.set(cache)
    try:
        yield
    finally:
        _collector.reset(token)


def scoring_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """Same output as SDPA (inference only), plus mass to the active cache for this layer."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out, mass = attention_with_key_mass(query, key, value, attention_mask, scaling)
    cache = _collector.get()
    if cache is not None:
        cache.add_attention_mass(module.layer_idx, mass[0])
    return out, None


def _materialised_sdpa_mask(*args, **kwargs):
    # Always a real boolean mask: SDPA's "skip the mask, use is_causal" shortcut assumes the
    # queries start at key 0, which is false for a chunk appended to a cache.
    return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})


AttentionInterface.register(SCORING_ATTENTION, scoring_attention)
AttentionMaskInterface.register(SCORING_ATTENTION, _materialised_sdpa_mask)
