"""Choose the attention-with-key-mass implementation: the Triton kernel on CUDA, the reference elsewhere.

One switch forces either: `INFMLLM_ATTENTION_KERNEL=triton|reference|auto` in the environment, or
`use_kernel(...)` at run time. Forcing `triton` off CUDA is for `TRITON_INTERPRET=1` (tests).
The kernel handles the streaming mask only (a causal chunk at the end of the keys); any other
mask, such as padding, goes to the reference, which takes arbitrary masks.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from .reference import attention_with_key_mass_reference

CHOICES = ("auto", "triton", "reference")
_choice = os.environ.get("INFMLLM_ATTENTION_KERNEL", "auto")


def use_kernel(choice: str) -> None:
    global _choice
    if choice not in CHOICES:
        raise ValueError(f"attention kernel {choice!r} is not one of {CHOICES}")
    _choice = choice


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def active_kernel(device: torch.device) -> str:
    if _choice == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "reference"
    return _choice


def is_streaming_causal(mask: torch.Tensor | None, q_len: int, k_len: int) -> bool:
    """True when `mask` is exactly "the Q queries are the last Q of the K keys, causal"."""
    if mask is None:
        return True
    if mask.dtype != torch.bool or mask.shape[0] != 1 or mask.shape[-2:] != (q_len, k_len):
        return False
    expected = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril(k_len - q_len)
    return bool(torch.equal(mask[0, 0], expected))


def attention_with_key_mass(query, key, value, mask, scaling):
    """Attention output (B, Q, Hq, D) and per-key mass (B, Hkv, K); see reference.py for the contract."""
    if active_kernel(query.device) == "triton" and is_streaming_causal(mask, query.shape[2], key.shape[2]):
        from .triton_attention import attention_with_key_mass_triton
        return attention_with_key_mass_triton(query, key, value, scaling)
    return attention_with_key_mass_reference(query, key, value, mask, scaling)
