"""Recall store: the keys and values of frames a policy evicted, in host memory, indexed per frame.

Inf-MLLM, StreamingLLM and H2O forget for good what they evict; ReKV and LiveVLM keep evicted video
KV off the accelerator and bring back the frames a question needs. This module is the store: whole
frames (every layer's keys and values; each key turned back by its position, so it compares with a
query before RoPE and can be re-rotated exactly to wherever it is re-inserted), bounded to
`capacity_mb` with the oldest frames leaving first, and the choice of frames for a question: the
attention the question's queries would give each stored frame (positions aside). It knows nothing
of models, policies or ROS.

Why attention and not a small index per frame (a mean key, as ReKV-style retrieval often keeps):
in a one-off comparison while building this (the embedded model, one 10-minute episode, infmllm at
a 5 % budget, 4 frames recalled), a question's mean query against each frame's mean key found a
frame of the evidence for 19 of 55 distant questions, attention over the frames' tokens for 23:
averaging a frame's 16 patches washes out the one object asked about. Scoring costs one attention
pass of the question's last token over the store, which the store's keys already allow.

The cache hands it each frame an eviction first takes tokens of (`BoundedCache(store=...)`); for a
question the session scores the stored frames against the question's queries (`probe.QueryProbe`),
the cache puts the best back for that answer only (`BoundedCache.recall` / `release_recalled`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch


@dataclass
class StoredFrame:
    """One frame's tokens, all layers: keys and values, per layer (kv_heads, tokens, dim). Keys are
    turned back by their position's temporal axis: un-rotated under 1-D RoPE; under M-RoPE a visual
    token keeps the rotation of its place in the frame's grid (height, width bands)."""

    stamp: float | None
    first_token: int                  # the frame's first token's index in the whole stream
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    positions: torch.Tensor           # (tokens, 3): positions relative to the frame's first token

    def __post_init__(self) -> None:
        if not self.keys or len(self.keys) != len(self.values):
            raise ValueError("a stored frame needs keys and values for every layer")
        tokens = self.positions.shape[0]
        if any(k.shape[:2] != v.shape[:2] or k.shape[1] != tokens for k, v in zip(self.keys, self.values)):
            raise ValueError("every layer must hold the frame's same tokens, one position each")

    @property
    def tokens(self) -> int:
        return self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, self.positions]
        return sum(t.numel() * t.element_size() for t in tensors)


class RecallStore:
    """Evicted frames, oldest first, within `capacity_mb` (0: store nothing, recall off)."""

    def __init__(self, capacity_mb: float) -> None:
        if capacity_mb < 0:
            raise ValueError(f"recall_store_mb must be >= 0, got {capacity_mb}")
        self.capacity_bytes = int(capacity_mb * 2**20)
        self.frames: deque[StoredFrame] = deque()
        self.bytes = 0
        self.added = 0      # frames offered
        self.dropped = 0    # frames that left (or never entered) to keep within capacity

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def megabytes(self) -> float:
        return self.bytes / 2**20

    def add(self, frame: StoredFrame) -> None:
        """Keep `frame` (moved to host memory); the oldest frames leave until the store fits."""
        self.added += 1
        if frame.nbytes > self.capacity_bytes:
            self.dropped += 1
            return
        frame.keys = [k.to("cpu") for k in frame.keys]
        frame.values = [v.to("cpu") for v in frame.values]
        frame.positions = frame.positions.to("cpu")
        self.frames.append(frame)
        self.bytes += frame.nbytes
        while self.bytes > self.capacity_bytes:
            self.bytes -= self.frames.popleft().nbytes
            self.dropped += 1

    def best(self, queries: list[torch.Tensor], count: int, skip: torch.Tensor | None = None) -> list[StoredFrame]:
        """The `count` stored frames a question attends to most, returned in stream order.

        queries: per layer, the question's un-rotated queries grouped by the KV head they read,
        (kv_heads, n, head_dim). Each frame's score is the attention mass the queries would give its
        tokens if the whole store were their context (positions aside), summed over queries, heads
        and layers. `skip` (frames,) bool: frames not to choose (e.g. still mostly cached)."""
        if count < 0:
            raise ValueError(f"recall_frames must be >= 0, got {count}")
        if not self.frames or count == 0:
            return []
        scores = self.attention(queries)
        if skip is not None:
            scores = scores.masked_fill(skip, float("-inf"))
        count = min(count, int(scores.isfinite().sum()))
        chosen = scores.topk(count).indices.tolist()
        return sorted((self.frames[i] for i in chosen), key=lambda frame: frame.first_token)

    def spans(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each stored frame's stream span: (first tokens, ends), in stream order."""
        firsts = torch.tensor([frame.first_token for frame in self.frames])
        return firsts, firsts + torch.tensor([frame.tokens for frame in self.frames])

    def attention(self, queries: list[torch.Tensor], frames_at_once: int = 256) -> torch.Tensor:
        """Attention mass per stored frame (frames,), as `best` scores them.

        Per query, a frame's share is the softmax, over frames, of the log-sum-exp of its tokens'
        logits: exactly the mass of one softmax over all stored tokens, computed `frames_at_once`
        frames at a time so no concatenation of the whole store is ever made."""
        if len(queries) != len(self.frames[0].keys):
            raise ValueError(f"queries for {len(queries)} layers, the store holds {len(self.frames[0].keys)}")
        frames = list(self.frames)
        # groups of frames with the same token count, stacked (pruned frames vary in size): by size,
        # in stream order within a size, each group's scores written back to its frames' columns
        order = sorted(range(len(frames)), key=lambda index: frames[index].tokens)
        per_frame = None   # (layers, heads, n, frames) log-sum-exp of each frame's logits
        start = 0
        while start < len(order):
            end = start + 1
            while (end < len(order) and end - start < frames_at_once
                   and frames[order[end]].tokens == frames[order[start]].tokens):
                end += 1
            group = order[start:end]
            per_layer = []
            for layer, query in enumerate(queries):
                keys = torch.stack([frames[index].keys[layer] for index in group]).float()   # (f, heads, tokens, dim)
                logits = torch.einsum("hnd,fhtd->hnft", query.float().cpu(), keys) * query.shape[-1] ** -0.5
                per_layer.append(logits.logsumexp(dim=-1))
            scores = torch.stack(per_layer)
            if per_frame is None:
                per_frame = scores.new_empty(*scores.shape[:-1], len(frames))
            per_frame[..., group] = scores
            start = end
        mass = per_frame.softmax(dim=-1)
        return mass.sum(dim=(0, 1, 2))
