"""Recall store: the keys and values of frames a policy evicted, in host memory, indexed per frame.

Inf-MLLM, StreamingLLM and H2O forget for good what they evict; ReKV and LiveVLM keep evicted video
KV off the accelerator and bring back the frames a question needs. This module is the store: whole
frames (every layer's keys and values; keys turned back to position 0, so they can be re-rotated
exactly to wherever they are re-inserted), a small index per frame (its mean un-rotated key per
layer and KV head: what a question's mean query is scored against), bounded to `capacity_mb` with
the oldest frames leaving first. It knows nothing of models, policies or ROS.

The cache hands it each frame an eviction first takes tokens of (`BoundedCache(store=...)`). Not
yet done (the recall issue): the session scoring stored frames against a question, re-inserting the
best for the answer and removing them after, and `recall_store_mb` / `recall_frames` as settings.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass
class StoredFrame:
    """One frame's tokens, all layers: keys (un-rotated) and values, per layer (kv_heads, tokens, dim)."""

    stamp: float | None
    first_token: int                  # the frame's first token's index in the whole stream
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    positions: torch.Tensor           # (tokens, 3): positions relative to the frame's first token
    index: torch.Tensor = field(init=False)   # (layers, kv_heads, dim) float32: mean key per layer and head

    def __post_init__(self) -> None:
        if not self.keys or len(self.keys) != len(self.values):
            raise ValueError("a stored frame needs keys and values for every layer")
        tokens = self.positions.shape[0]
        if any(k.shape[:2] != v.shape[:2] or k.shape[1] != tokens for k, v in zip(self.keys, self.values)):
            raise ValueError("every layer must hold the frame's same tokens, one position each")
        self.index = torch.stack([k.float().mean(dim=1) for k in self.keys])

    @property
    def tokens(self) -> int:
        return self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, self.positions, self.index]
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
        frame.positions, frame.index = frame.positions.to("cpu"), frame.index.to("cpu")
        self.frames.append(frame)
        self.bytes += frame.nbytes
        while self.bytes > self.capacity_bytes:
            self.bytes -= self.frames.popleft().nbytes
            self.dropped += 1

    def best(self, query_index: torch.Tensor, count: int) -> list[StoredFrame]:
        """The `count` stored frames whose index best matches a question's mean un-rotated query
        (layers, kv_heads, dim; query heads averaged over each KV head's group), by dot product
        summed over layers and heads; returned in stream order."""
        if count < 0:
            raise ValueError(f"recall_frames must be >= 0, got {count}")
        if not self.frames or count == 0:
            return []
        indexes = torch.stack([frame.index for frame in self.frames])          # (frames, layers, heads, dim)
        scores = (indexes * query_index.float().cpu()[None]).sum(dim=(1, 2, 3))
        chosen = scores.topk(min(count, len(self.frames))).indices.tolist()
        return sorted((self.frames[i] for i in chosen), key=lambda frame: frame.first_token)
