"""A transformers `Cache` whose layers stay within a policy's budget.

Each layer owns its keys, values and, per KV head, what the policies and the re-indexing need:
the accumulated attention mass of every key, its current (3-axis) position and the segment it
moves with. The model only sees the standard Cache interface; eviction runs between forwards
(never inside `update()`), driven by the session.

Keys and values live in storage reserved ahead (a bounded policy's whole budget + chunk at the
first token), so a decoding step writes its one token in place. transformers' DynamicLayer
concatenates instead, copying every cached key and value on every token: on SmolVLM-256M's shape
at 2 k tokens (the realsize suite's model directory, cProfile over 20 decoding steps) torch.cat
took 9.6 of 88 ms a token, traffic the memory-bandwidth floor does not allow for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .policies import CachePolicy
from .recall import RecallStore, StoredFrame
from .rope import packed_positions, shift_rotated_keys


@dataclass
class ChunkLayout:
    """Where the tokens of the next forward sit: positions (n, 3), segment ids (n,) and, set by the
    cache, their index in the whole stream (n,)."""

    positions: torch.Tensor
    segments: torch.Tensor
    token_index: torch.Tensor | None = None


class ReservedTokens:
    """A tensor growing along its token axis (`axis`: 2 for (1, heads, tokens, dim) keys and values,
    1 for (heads, tokens, ...) per-key bookkeeping) with room reserved ahead: appending writes in
    place; `capacity` (a bounded policy's budget + chunk, + the recall allowance) is reserved at
    once, and without one, or past it, the room doubles, so appends stay amortised O(new tokens).
    Writes run in inference mode (the cache serves inference only): the storage is made inside a
    forward and evictions write to it between forwards."""

    def __init__(self, capacity: int | None, axis: int = 2) -> None:
        self.capacity = capacity
        self.axis = axis
        self.store: torch.Tensor | None = None
        self.length = 0
        self._view: torch.Tensor | None = None   # made once per write: a decoding step reads it often

    @torch.inference_mode()
    def append(self, new: torch.Tensor) -> torch.Tensor:
        needed = self.length + new.shape[self.axis]
        if self.store is None or needed > self.store.shape[self.axis]:
            room = self.capacity if self.capacity and needed <= self.capacity else 2 * needed
            shape = list(new.shape)
            shape[self.axis] = room
            grown = new.new_empty(shape)
            if self.length:
                grown.narrow(self.axis, 0, self.length).copy_(self.view())
            self.store = grown
        self.store.narrow(self.axis, self.length, needed - self.length).copy_(new)
        self.length = needed
        self._view = self.store.narrow(self.axis, 0, self.length)
        return self._view

    @torch.inference_mode()
    def replace(self, tensor: torch.Tensor) -> torch.Tensor:
        """Hold exactly `tensor` (after an eviction or a re-rotation), in the same storage."""
        if self.store is not None and tensor.untyped_storage().data_ptr() == self.store.untyped_storage().data_ptr():
            current = self.view()
            if (tensor.shape, tensor.stride(), tensor.data_ptr()) == (current.shape, current.stride(), current.data_ptr()):
                return current   # already what it holds (a policy hook returning its input)
            tensor = tensor.clone()   # a view of this storage would be overwritten while it is copied
        self.length = 0
        return self.append(tensor)

    def view(self) -> torch.Tensor | None:
        return self._view

    def nbytes(self) -> int:
        return 0 if self.store is None else self.store.numel() * self.store.element_size()


class _Bookkeeping:
    """A per-key tensor of a BoundedLayer, (kv_heads, L, ...), kept in a ReservedTokens store: a
    decoded token appends in place instead of copying the layer's whole history (four torch.cat
    per layer and token before: a tenth of a SmolVLM-256M decoding step at 1 k tokens). Reading
    gives a view of the store, valid until the next write; assigning replaces the contents."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, layer, owner=None):
        return self if layer is None else layer.stores[self.name].view()

    def __set__(self, layer, value: torch.Tensor) -> None:
        layer.stores[self.name].replace(value)


def _per_head(tensor: torch.Tensor, heads: int, device) -> torch.Tensor:
    """The same tokens' bookkeeping for every KV head of a layer."""
    return tensor.to(device).expand(heads, *tensor.shape)


class BoundedLayer(DynamicLayer):
    """One layer's KV tensors (batch 1) plus per-key bookkeeping, all evicted together."""

    BOOKKEEPING = ("attention_mass", "positions", "segments", "token_index")
    attention_mass = _Bookkeeping()   # (kv_heads, L) float32
    positions = _Bookkeeping()        # (kv_heads, L, 3) long
    segments = _Bookkeeping()         # (kv_heads, L) long
    token_index = _Bookkeeping()      # (kv_heads, L) long: n-th token of the stream

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self._empty_stores(capacity)
        self.pending: ChunkLayout | None = None

    def _empty_stores(self, capacity: int | None) -> None:
        self.key_store, self.value_store = ReservedTokens(capacity), ReservedTokens(capacity)
        self.stores = {name: ReservedTokens(capacity, axis=1) for name in self.BOOKKEEPING}

    def update(self, key_states, value_states, *args, **kwargs):
        if key_states.shape[0] != 1:
            raise ValueError("a streaming cache holds one stream (batch size 1)")
        if self.pending is None or self.pending.segments.numel() != key_states.shape[-2]:
            raise RuntimeError("BoundedCache.admit(inputs) must come before every forward")
        heads, count, device = key_states.shape[1], key_states.shape[-2], key_states.device
        layout, self.pending = self.pending, None
        self.stores["positions"].append(layout.positions.to(device).expand(heads, -1, -1))
        self.stores["segments"].append(layout.segments.to(device).expand(heads, -1))
        self.stores["token_index"].append(layout.token_index.to(device).expand(heads, -1))
        self.stores["attention_mass"].append(torch.zeros(heads, count, dtype=torch.float32, device=device))
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.key_store.append(key_states), self.value_store.append(value_states)
        return self.keys, self.values

    def reset(self) -> None:
        super().reset()
        self._empty_stores(self.key_store.capacity)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a bounded cache evicts through its policy, not by cropping")

    @property
    def length(self) -> int:
        return self.get_seq_length()

    def keep(self, indices: torch.Tensor) -> None:
        """Keep the slots `indices` (kv_heads, n), per head, in order."""
        indices = indices.to(self.keys.device)
        gather4 = indices[None, :, :, None].expand(1, -1, -1, self.keys.shape[-1])
        self.keys = self.key_store.replace(self.keys.gather(2, gather4))
        self.values = self.value_store.replace(
            self.values.gather(2, indices[None, :, :, None].expand(1, -1, -1, self.values.shape[-1])))
        self.attention_mass = self.attention_mass.gather(1, indices)
        self.segments = self.segments.gather(1, indices)
        self.token_index = self.token_index.gather(1, indices)
        self.positions = self.positions.gather(1, indices[:, :, None].expand(-1, -1, 3))

    def insert(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor,
               token_index: torch.Tensor, order: torch.Tensor) -> None:
        """Add tokens between forwards (keys rotated at `positions`; all per head, (kv_heads, n, ...)) and
        put every slot in the order of `order` (kv_heads, L + n), ascending: eviction and re-indexing
        read slots in stream order."""
        keys, values = torch.cat([self.keys, keys[None]], dim=2), torch.cat([self.values, values[None]], dim=2)
        self.positions = torch.cat([self.positions, positions], dim=1)
        self.segments = torch.cat([self.segments, segments], dim=1)
        self.token_index = torch.cat([self.token_index, token_index], dim=1)
        self.attention_mass = torch.cat([self.attention_mass, torch.zeros_like(token_index, dtype=torch.float32)],
                                        dim=1)
        self.keys, self.values = self.key_store.replace(keys), self.value_store.replace(values)
        self.keep(order.argsort(dim=1, stable=True))

    def move_to(self, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
        """Give the cached tokens new positions, re-rotating their keys exactly."""
        shift = (positions[..., 0] - self.positions[..., 0])[None]
        self.keys = self.key_store.replace(shift_rotated_keys(self.keys, shift, inv_freq))
        self.positions = positions

    def nbytes(self) -> int:
        """Bytes held, reserved room included."""
        return self.key_store.nbytes() + self.value_store.nbytes() + sum(
            store.nbytes() for store in self.stores.values())


class BoundedCache(Cache):
    """All layers of one stream under one policy, and the positions of what they hold.

    One verb per forward: `admit(inputs)` before it (evicts if the policy says so, then lays out
    the new tokens after the cached ones and returns their position ids); the forward's
    `update()` calls then append what was admitted.

    All layers always hold the same number of tokens (per KV head): transformers builds one mask
    from layer 0's size for every layer, and the policies keep exactly `budget` tokens.
    """

    def __init__(self, num_layers: int, policy: CachePolicy, inv_freq: torch.Tensor, positions,
                 store: RecallStore | None = None, recall_allowance: int = 0) -> None:
        """`positions`: the model's position scheme (adapters.positions_for): 1-D RoPE or M-RoPE.
        `store`: where whole frames go the first time an eviction takes any of their tokens;
        `recall_allowance`: the tokens of the frames one answer may recall (reserved ahead too)."""
        capacity = policy.max_length + recall_allowance if policy.max_length != float("inf") else None
        super().__init__(layers=[BoundedLayer(capacity) for _ in range(num_layers)])
        self.policy = policy
        self.inv_freq = inv_freq
        self.positions = positions
        self.next_position = 0   # the position the next admitted token starts from
        self.next_segment = 0    # segments: runs of tokens that move together when re-indexed
        self.tokens_seen = 0
        self.store = store
        self.recalled_tokens = 0   # tokens of recalled frames in the cache now (one answer's worth)
        self.unstored_frames: list[tuple[int, int, float | None]] = []   # (first token, end, stamp)
        self.evictions = 0
        self.eviction_seconds = 0.0   # time spent choosing survivors and re-indexing (benchmarks)

    @property
    def length(self) -> int:
        return self.layers[0].length

    def admit(self, inputs: dict, frame: bool = False, stamp: float | None = None,
              keep: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """Make room for the forward that appends `inputs` (evicting and re-indexing if the policy
        says so) and lay out its tokens after the cached ones: (position ids for the model, evicted).
        `frame`: these tokens are one camera frame (taken at `stamp`), stored whole when evicted.
        `keep` (n,) bool: only these tokens are appended (temporal pruning), each at the position the
        whole input gives it, and the next input starts after the whole input."""
        count = inputs["input_ids"].shape[-1] if keep is None else int(keep.sum())
        evicted = self.make_room(count)
        if frame and self.store is not None:
            self.unstored_frames.append((self.tokens_seen, self.tokens_seen + count, stamp))
        layout, position_ids = self._lay_out(inputs)
        if keep is not None:
            keep = keep.cpu()
            layout = ChunkLayout(positions=layout.positions[keep], segments=layout.segments[keep])
            position_ids = position_ids[..., keep]
        self._expect(layout)
        return position_ids, evicted

    def skip(self, inputs: dict) -> None:
        """Advance positions past `inputs` without appending them (a frame left out whole): what follows
        sits as if it had been streamed, as after a gap in the camera, until the next eviction packs
        the cache's positions again."""
        self._lay_out(inputs)

    def _lay_out(self, inputs: dict) -> tuple[ChunkLayout, torch.Tensor]:
        """`inputs` laid out after everything streamed so far; the next input starts after them."""
        layout, position_ids = self.positions.layout(inputs, self.next_position, self.next_segment)
        self.next_segment = int(layout.segments.max()) + 1
        self.next_position = int(position_ids.max()) + 1
        return layout, position_ids

    def _expect(self, layout: ChunkLayout) -> None:
        """Hand every layer the positions/segments of the tokens the next forward appends."""
        count = layout.segments.numel()
        layout.token_index = torch.arange(self.tokens_seen, self.tokens_seen + count)
        self.tokens_seen += count
        for layer in self.layers:
            layer.pending = layout

    def add_attention_mass(self, layer_idx: int, mass: torch.Tensor) -> None:
        """Fold one forward's per-key attention mass (kv_heads, L) into a layer's running score."""
        layer = self.layers[layer_idx]
        layer.attention_mass = self.policy.fold_mass(layer.attention_mass, mass.to(layer.attention_mass))

    def make_room(self, incoming: int) -> bool:
        """Evict back to the budget if `incoming` more tokens would pass budget + chunk (recalled frames
        are an allowance on top, not counted)."""
        if self.length == 0 or not self.policy.must_evict(self.length - self.recalled_tokens, incoming):
            return False
        if incoming > self.policy.chunk:
            raise ValueError(f"a forward of {incoming} tokens exceeds the eviction chunk ({self.policy.chunk})")
        started = time.perf_counter()
        self.release_recalled()   # policies pick survivors among stream-ordered slots of the stream itself
        keeps = [self.policy.keep_indices(layer.attention_mass, layer.length, layer.keys.shape[1])
                 for layer in self.layers]
        if self.store is not None and self.unstored_frames:
            self._store_frames_leaving(keeps)
        for layer, keep in zip(self.layers, keeps):
            layer.keep(keep)
            layer.attention_mass = self.policy.after_eviction(layer.attention_mass)
        self._reindex()
        self.evictions += 1
        self.eviction_seconds += time.perf_counter() - started
        return True

    def _store_frames_leaving(self, keeps: list[torch.Tensor]) -> None:
        """Hand the store every frame this eviction takes tokens of, whole, before any is lost.

        A frame is stored the first time an eviction touches it, so until then every layer and
        head still holds all of its tokens (each layer and head evicts on its own)."""
        dropped = []
        for layer, keep in zip(self.layers, keeps):
            kept = torch.zeros_like(layer.token_index, dtype=torch.bool)
            kept.scatter_(1, keep.to(kept.device), True)
            dropped.append(layer.token_index[~kept])
        dropped = torch.cat(dropped).unique()
        staying = []
        for first, end, stamp in self.unstored_frames:
            if bool(((dropped >= first) & (dropped < end)).any()):
                self.store.add(self._whole_frame(first, end, stamp))
            else:
                staying.append((first, end, stamp))
        self.unstored_frames = staying

    def _whole_frame(self, first: int, end: int, stamp: float | None) -> StoredFrame:
        """Every layer's keys and values of the stream tokens [first, end), which every layer and
        head still holds; each key turned back by its own position (its temporal axis under M-RoPE),
        so it compares with a query before RoPE, and its positions relative to the frame's start."""
        keys, values, relative = [], [], None
        for layer in self.layers:
            heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
            inside = (layer.token_index >= first) & (layer.token_index < end)
            slots = inside.nonzero()[:, 1].view(heads, end - first)      # per head, in stream order
            positions = layer.positions.gather(1, slots[..., None].expand(-1, -1, 3))
            base = positions.amin(dim=(1, 2))                                  # per head: the frame's start
            gathered = layer.keys[0].gather(1, slots[..., None].expand(-1, -1, dim))
            keys.append(shift_rotated_keys(gathered, -positions[..., 0], self.inv_freq))
            values.append(layer.values[0].gather(1, slots[..., None].expand(-1, -1, layer.values.shape[-1])))
            relative = positions[0] - base[0] if relative is None else relative
        return StoredFrame(stamp=stamp, first_token=first, keys=keys, values=values, positions=relative)

    def forget_newest(self, count: int) -> None:
        """Drop the `count` newest tokens as if never admitted (a question fed once to read its queries)."""
        if not 0 < count <= self.length - self.recalled_tokens:
            raise ValueError(f"cannot forget {count} of {self.length - self.recalled_tokens} tokens")
        first_forgotten = int(self.layers[0].positions[0, self.length - count, 0])   # read before keep() rewrites it
        for layer in self.layers:
            heads = layer.keys.shape[1]
            layer.keep(torch.arange(layer.length - count, device=layer.keys.device).expand(heads, -1))
        self.tokens_seen -= count
        self.next_position = first_forgotten

    def recall(self, frames: list[StoredFrame]) -> None:
        """Put stored frames back for one answer: each frame's tokens, whole, in every layer and head,
        in stream order among the cached tokens (before any of its own tokens a policy kept, so a
        token kept there counts twice while recalled), then re-index so they sit at exact positions.
        `release_recalled` takes them out again; until then they do not count against the budget."""
        if self.recalled_tokens:
            raise RuntimeError("frames are already recalled: release them first")
        if not frames:
            return
        self.recalled_tokens = sum(frame.tokens for frame in frames)   # first: a failure below is released too
        index = torch.cat([frame.first_token + torch.arange(frame.tokens) for frame in frames])
        # each frame just before its first stream index (so before any of its own kept tokens), in frame order
        order = torch.cat([frame.first_token - 1 + torch.arange(1, frame.tokens + 1, dtype=torch.float64)
                           / (frame.tokens + 1) for frame in frames])
        segments = torch.cat([torch.full((frame.tokens,), -1 - number) for number, frame in enumerate(frames)])
        positions = torch.cat([frame.positions for frame in frames])   # frame-relative: keys are rotated there
        for number, layer in enumerate(self.layers):
            heads, device = layer.keys.shape[1], layer.keys.device
            keys = [shift_rotated_keys(frame.keys[number].to(layer.keys),
                                       _per_head(frame.positions[:, 0], heads, device), self.inv_freq)
                    for frame in frames]   # rotated to the frame-relative positions they are inserted at
            layer.insert(torch.cat(keys, dim=1),
                         torch.cat([frame.values[number] for frame in frames], dim=1).to(layer.values),
                         _per_head(positions, heads, device), _per_head(segments, heads, device),
                         _per_head(index, heads, device),
                         torch.cat([layer.token_index.double(), _per_head(order, heads, device)], dim=1))
        self._reindex()

    def release_recalled(self) -> None:
        """Take recalled frames out again (and re-index): the bounded cache is as the answer left it.
        Each layer drops what it holds of them (all, or nothing if a recall failed before reaching it)."""
        if not self.recalled_tokens:
            return
        for layer in self.layers:
            if bool((layer.segments < 0).any()):
                layer.keep((layer.segments >= 0).nonzero()[:, 1].view(layer.keys.shape[1], -1))
        self.recalled_tokens = 0
        self._reindex()

    def _reindex(self) -> None:
        """StreamingLLM-style positions: pack each head's tokens, align all heads on the newest.

        RoPE attention depends only on query-key distances, so aligning every head's newest token
        just below one shared `next_position` keeps the same distances a compact packing gives,
        while letting new queries use a single position for all heads and layers.
        """
        packed = [packed_positions(layer.positions, layer.segments) for layer in self.layers]
        self.next_position = int(max(span.max() for _, span in packed))
        for layer, (positions, span) in zip(self.layers, packed):
            aligned = positions + (self.next_position - span)[:, None, None]
            layer.move_to(aligned, self.inv_freq)

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)

    def cached_share(self, firsts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Per frame [firsts[i], ends[i]) (stream indices, ascending, disjoint): the share of its tokens
        still cached, averaged over layers and KV heads (recalled copies not counted)."""
        share = torch.zeros(len(firsts))
        for layer in self.layers:
            index = layer.token_index[layer.segments >= 0].cpu()
            frame = torch.searchsorted(firsts, index, right=True) - 1
            inside = (frame >= 0) & (index < ends[frame.clamp(min=0)])
            share += torch.bincount(frame[inside], minlength=len(firsts)).float() / layer.keys.shape[1]
        return share / len(self.layers) / (ends - firsts).float()

    def kept_share(self, spans: list[tuple[int, int]]) -> float:
        """Share of the stream tokens in `spans` ([start, end) stream indices) still cached, averaged
        over layers and KV heads: how much of some evidence (an object's frames) a policy kept."""
        total = sum(end - start for start, end in spans)
        if total <= 0 or self.length == 0:
            return 0.0
        kept = 0.0
        for layer in self.layers:
            inside = torch.zeros_like(layer.token_index, dtype=torch.bool)
            for start, end in spans:
                inside |= (layer.token_index >= start) & (layer.token_index < end)
            kept += inside.sum(dim=-1).float().mean().item()
        return kept / len(self.layers) / total
