"""StreamingLLM-style re-indexing of cached keys after eviction, exact for RoPE and M-RoPE.

Keys are cached after rotation. RoPE is a rotation by position x frequency, so moving a cached
key from position p to p' is one more rotation by (p' - p) x frequency: exact up to float
rounding, no need to keep pre-rotation keys.

M-RoPE (Qwen2-VL, Qwen2.5-VL) rotates each frequency band by one of three axes (time, height,
width). We only ever shift all three axes of a token by the same amount, so the extra rotation is
the same per frequency whatever its axis: one formula serves both kinds. A frame's visual tokens
are shifted together (one *segment*), so their grid offsets survive re-indexing untouched.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The pairing transformers' Llama/Qwen rotary embedding uses (halves, not interleaved)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def shift_rotated_keys(keys: torch.Tensor, shift: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Re-rotate post-RoPE keys by `shift` positions.

    keys: (..., tokens, head_dim); shift: broadcastable to (..., tokens), integer or float;
    inv_freq: (rotary_dim / 2,). With partial rotary embeddings only the first rotary_dim
    channels rotate, as in the models.
    Attention scaling of scaled RoPE variants multiplies cos/sin once at first rotation and is
    deliberately not applied again here.
    """
    rotary_dim = inv_freq.numel() * 2
    angles = shift.to(torch.float32).unsqueeze(-1) * inv_freq.to(device=keys.device, dtype=torch.float32)
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    rotary = keys[..., :rotary_dim].float()
    rotated = (rotary * cos + rotate_half(rotary) * sin).to(keys.dtype)
    if rotary_dim == keys.shape[-1]:
        return rotated
    return torch.cat((rotated, keys[..., rotary_dim:]), dim=-1)


def packed_positions(positions: torch.Tensor, segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """New positions for the tokens a head kept, packed contiguously in stream order.

    positions: (heads, tokens, 3) current positions (all three axes equal for plain RoPE);
    segments: (heads, tokens) id of the group a token is shifted with (a frame's visual tokens
    share one; text tokens have their own); a group's tokens are contiguous, and only where the id
    changes matters (frames put back by recall carry negative ids between the stream's).
    Each segment keeps its internal offsets; segment k starts one past the end of segment k-1,
    and the first segment starts at 0. Returns (new_positions, span) where span (heads,) is one
    past the largest new position: the head's next free position.
    """
    heads, tokens, _ = positions.shape
    starts_here = torch.ones(heads, tokens, dtype=torch.bool, device=positions.device)
    starts_here[:, 1:] = segments[:, 1:] != segments[:, :-1]
    segment_index = starts_here.long().cumsum(dim=-1) - 1          # 0.. per head
    count = int(segment_index.max()) + 1 if tokens else 0
    low = positions.amin(dim=-1)
    high = positions.amax(dim=-1)
    big = torch.iinfo(torch.long).max
    seg_low = torch.full((heads, count), big, dtype=torch.long, device=positions.device)
    seg_high = torch.full((heads, count), -big, dtype=torch.long, device=positions.device)
    seg_low.scatter_reduce_(1, segment_index, low.long(), reduce="amin")
    seg_high.scatter_reduce_(1, segment_index, high.long(), reduce="amax")
    used = seg_low != big                                          # heads with fewer segments
    extent = torch.where(used, seg_high - seg_low + 1, torch.zeros_like(seg_low))
    new_low = extent.cumsum(dim=-1) - extent
    shift = (new_low - seg_low).gather(1, segment_index)
    return positions + shift.unsqueeze(-1), extent.sum(dim=-1)
