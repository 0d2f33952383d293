"""Fused Triton kernel: attention over the KV cache that also writes per-key attention mass.

One program owns a block of query rows (the query heads of one KV-head group times the chunk's
queries, flattened) against all keys of that KV head. It streams the keys twice: first for the
softmax statistics (row max and normaliser), then for the output and the exact normalised
probabilities, whose column sums it adds to the key mass. Nothing of size queries x keys ever
leaves on-chip memory, which is what eager attention plus a scoring pass cost on a long cache.
Masking is the streaming case only: the Q queries are the last Q positions of the K keys (a chunk
appended to a cache), causal within the chunk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _masked_logits(q, key_base, cols, dims, row_ok, dim_ok, query_position, stride_kn, stride_kd, k_len, scale,
                   PRECISION: tl.constexpr):
    """Scaled, masked logits of a query-row block against one block of keys (both passes)."""
    col_ok = cols < k_len
    k = tl.load(key_base + cols[:, None] * stride_kn + dims[None, :] * stride_kd,
                mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
    logits = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    allowed = row_ok[:, None] & col_ok[None, :] & (cols[None, :] <= query_position[:, None])
    return tl.where(allowed, logits, float("-inf")), col_ok


@triton.jit
def _attention_with_key_mass_kernel(
    Q, K, V, Out, Mass,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_mb, stride_mh, stride_mn,
    kv_heads, q_len, k_len, head_dim, group, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    row_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // kv_heads
    head = batch_head % kv_heads

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < group * q_len
    query_head = head * group + rows // q_len
    query_index = rows % q_len
    query_position = k_len - q_len + query_index
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim

    q = tl.load(Q + batch * stride_qb + query_head[:, None] * stride_qh + query_index[:, None] * stride_qm
                + dims[None, :] * stride_qd, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    key_base = K + batch * stride_kb + head * stride_kh
    value_base = V + batch * stride_vb + head * stride_vh

    # Pass 1: softmax statistics per row (online max and normaliser).
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, k_len, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        logits, _ = _masked_logits(q, key_base, cols, dims, row_ok, dim_ok, query_position, stride_kn, stride_kd,
                                   k_len, scale, PRECISION)
        new_max = tl.maximum(row_max, tl.max(logits, 1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        row_sum = row_sum * tl.exp(row_max - safe_max) + tl.sum(tl.exp(logits - safe_max[:, None]), 1)
        row_max = new_max

    # Pass 2: normalised probabilities -> output and per-key mass.
    safe_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    inverse_sum = tl.where(row_sum > 0, 1.0 / tl.where(row_sum > 0, row_sum, 1.0), 0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, k_len, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        logits, col_ok = _masked_logits(q, key_base, cols, dims, row_ok, dim_ok, query_position, stride_kn,
                                        stride_kd, k_len, scale, PRECISION)
        v = tl.load(value_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        probs = tl.where(logits > float("-inf"), tl.exp(logits - safe_max[:, None]) * inverse_sum[:, None], 0.0)
        acc += tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
        tl.atomic_add(Mass + batch * stride_mb + head * stride_mh + cols * stride_mn, tl.sum(probs, 0), mask=col_ok)

    tl.store(Out + batch * stride_ob + query_head[:, None] * stride_oh + query_index[:, None] * stride_om
             + dims[None, :] * stride_od, acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def attention_with_key_mass_triton(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                                   block_m: int = 64, block_n: int = 64,
                                   out: torch.Tensor | None = None, mass: torch.Tensor | None = None):
    """Same contract as the torch reference with mask=None (the streaming-chunk causal mask).

    `out` and `mass` may be passed pre-allocated (tests poison them to catch unwritten elements);
    mass is accumulated into, so it must start at zero.
    """
    batch, q_heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    group = q_heads // kv_heads
    out = torch.empty_like(query) if out is None else out
    mass = torch.zeros(batch, kv_heads, k_len, dtype=torch.float32, device=query.device) if mass is None else mass
    block_d = max(16, triton.next_power_of_2(head_dim))
    grid = (triton.cdiv(group * q_len, block_m), batch * kv_heads)
    _attention_with_key_mass_kernel[grid](
        query, key, value, out, mass,
        *query.stride(), *key.stride(), *value.stride(), *out.stride(),
        *mass.stride(),
        kv_heads, q_len, k_len, head_dim, group, float(scaling),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
    )
    return out.transpose(1, 2).contiguous(), mass
