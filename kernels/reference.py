"""Torch reference: attention over a KV cache that also returns the attention mass per key.

This is the function the fused Triton kernel must reproduce, and what runs on CPU. Queries are
processed in blocks so memory stays O(block x keys) rather than O(queries x keys): a long prompt
never materialises its full attention matrix.
"""

from __future__ import annotations

import torch


def attention_with_key_mass_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    query_block: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with grouped-query heads, plus the attention each key received.

    query: (B, Hq, Q, D); key, value: (B, Hkv, K, D) with Hq a multiple of Hkv (GQA, not repeated).
    mask: bool (B or 1, 1, Q, K), True = may attend; None means causal with the Q queries being the
        last Q positions of the K keys (a chunk appended to a cache).
    Returns out (B, Q, Hq, D) (transformers' attention-output layout) and mass (B, Hkv, K) in
    float32: attention probabilities summed over the Q queries and the query heads of each group.
    """
    batch, q_heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    group = q_heads // kv_heads
    grouped = query.view(batch, kv_heads, group, q_len, head_dim)
    if q_len == 0:
        return query.new_empty(batch, 0, q_heads, value.shape[-1]), query.new_zeros(batch, kv_heads, k_len,
                                                                                   dtype=torch.float32)
    keys_t, values = key.float().transpose(-1, -2), value.float()
    blocks = []
    mass = None
    for start in range(0, q_len, query_block):
        stop = min(start + query_block, q_len)
        rows = group * (stop - start)
        # matmul over (group x block) rows per KV head rather than einsum: one batched GEMM without
        # einsum's planning, which cost as much as the product itself for one decoded token on a CPU
        block = grouped[:, :, :, start:stop].reshape(batch, kv_heads, rows, head_dim).float()
        logits = (block @ keys_t).view(batch, kv_heads, group, stop - start, k_len) * scaling
        allowed = _allowed(mask, start, stop, q_len, k_len, query.device)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a fully masked row attends nowhere
        blocks.append((probs.view(batch, kv_heads, rows, k_len) @ values).view(batch, kv_heads, group, stop - start, -1))
        block_mass = probs.sum(dim=(2, 3))
        mass = block_mass if mass is None else mass + block_mass
    out = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=3)
    out = out.to(query.dtype).view(batch, q_heads, q_len, -1).transpose(1, 2).contiguous()
    return out, mass


def _allowed(mask: torch.Tensor | None, start: int, stop: int, q_len: int, k_len: int,
             device: torch.device) -> torch.Tensor | None:
    """Boolean (B|1, 1|1, 1, q_block, K) view of which keys each query of the block may see; None
    when every query sees every key (a decoded token, usually: the mask pass is then skipped)."""
    if mask is None:
        if stop - start == 1 and start == q_len - 1:
            return None   # the last query of a causal chunk sees every key
        query_pos = torch.arange(start, stop, device=device)[:, None] + (k_len - q_len)
        return (torch.arange(k_len, device=device)[None, :] <= query_pos)[None, None, None]
    block = mask[:, :, start:stop].bool()
    if device.type == "cpu" and bool(block.all()):   # on a GPU the check would cost a synchronisation
        return None
    return block.unsqueeze(1)
