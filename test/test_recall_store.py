"""The recall store on its own: bounded by megabytes (oldest out, counted), frames chosen by the
attention a question's queries give them, returned in stream order; fed by the cache frame by frame. (Recall
through the session: test_recall.py.)"""

from __future__ import annotations

import pytest
import torch

from infmllm_ros.engine.recall import RecallStore, StoredFrame

LAYERS, HEADS, DIM, TOKENS = 3, 2, 8, 5


def frame(first_token: int, direction: torch.Tensor | None = None, seed: int = 0, tokens: int = TOKENS) -> StoredFrame:
    """Random keys; `direction` added to one token only (an object in one patch of the frame)."""
    generator = torch.Generator().manual_seed(seed + first_token)
    keys = [torch.randn(HEADS, tokens, DIM, generator=generator) for _ in range(LAYERS)]
    if direction is not None:
        for k in keys:
            k[:, 2] += direction
    values = [torch.randn(HEADS, tokens, DIM, generator=generator) for _ in range(LAYERS)]
    positions = torch.arange(tokens)[:, None].expand(-1, 3).clone()
    return StoredFrame(stamp=float(first_token), first_token=first_token, keys=keys, values=values,
                       positions=positions)


def test_the_store_keeps_within_its_megabytes_oldest_leaving_first():
    one = frame(0).nbytes
    store = RecallStore(capacity_mb=3.5 * one / 2**20)
    for number in range(10):
        store.add(frame(number * TOKENS))
        assert store.bytes <= store.capacity_bytes
    assert len(store) == 3 and [f.first_token for f in store.frames] == [7 * TOKENS, 8 * TOKENS, 9 * TOKENS]
    assert store.added == 10 and store.dropped == 7 and store.bytes == 3 * one


def test_a_store_of_zero_megabytes_keeps_nothing_and_recalls_nothing():
    store = RecallStore(capacity_mb=0)
    store.add(frame(0))
    assert len(store) == 0 and store.dropped == 1
    assert store.best([torch.ones(HEADS, 1, DIM)] * LAYERS, 4) == []


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="recall_store_mb"):
        RecallStore(capacity_mb=-1)
    with pytest.raises(ValueError, match="recall_frames"):
        RecallStore(capacity_mb=1).best([torch.ones(HEADS, 1, DIM)] * LAYERS, -1)
    with pytest.raises(ValueError, match="same tokens"):
        broken = frame(0)
        StoredFrame(stamp=None, first_token=0, keys=broken.keys, values=broken.values,
                    positions=broken.positions[:2])


def test_the_frames_the_question_attends_to_come_back_in_stream_order():
    """The object asked about is one token of a frame: a mean over the frame would wash it out
    (the random tokens around it are larger), attention finds it."""
    wanted = torch.zeros(DIM)
    wanted[3] = 6.0
    store = RecallStore(capacity_mb=64)
    matching = {40, 15}
    for number in range(12):
        first = number * TOKENS
        store.add(frame(first, direction=wanted if first in matching else None))
    unrelated = torch.randn(HEADS, 3, DIM, generator=torch.Generator().manual_seed(5))
    query = [torch.cat([unrelated, wanted.expand(HEADS, 1, DIM)], dim=1) for _ in range(LAYERS)]
    chosen = store.best(query, 2)
    assert [f.first_token for f in chosen] == sorted(matching)
    assert len(store.best(query, 100)) == 12
    # what comes back is what went in: keys and values unchanged
    again = frame(15, direction=wanted)
    assert all(torch.equal(a, b) for a, b in zip(chosen[0].keys, again.keys))
    assert all(torch.equal(a, b) for a, b in zip(chosen[0].values, again.values))


def test_frame_scores_are_one_softmax_over_every_stored_token():
    """Scored a few frames at a time (frames of different sizes apart), the mass per frame is that of
    a single softmax over the whole store's tokens."""
    store = RecallStore(capacity_mb=64)
    sizes = [5, 5, 5, 7, 7, 5, 3, 5, 5]
    first = 0
    for tokens in sizes:
        store.add(frame(first, tokens=tokens))
        first += tokens
    query = [torch.randn(HEADS, 4, DIM, generator=torch.Generator().manual_seed(layer)) for layer in range(LAYERS)]
    expected = torch.zeros(len(sizes))
    owner = torch.cat([torch.full((tokens,), number) for number, tokens in enumerate(sizes)])
    for layer, q in enumerate(query):
        keys = torch.cat([f.keys[layer] for f in store.frames], dim=1)         # (heads, all tokens, dim)
        weights = (q @ keys.transpose(1, 2) * DIM ** -0.5).softmax(dim=-1)     # (heads, n, all tokens)
        expected.index_add_(0, owner, weights.sum(dim=(0, 1)))
    torch.testing.assert_close(store.attention(query, frames_at_once=2), expected)
    assert abs(float(expected.sum()) - LAYERS * HEADS * 4) < 1e-4


def test_the_cache_stores_each_evicted_frame_whole_and_exactly():
    """Through a real session: a frame reaches the store the first time an eviction takes any of its
    tokens, with every layer's keys (each turned back by its position; re-rotated to where they were
    written they are the keys written, to float rounding) and values (unchanged)."""
    from infmllm_ros.engine.rope import shift_rotated_keys
    from infmllm_ros.engine.session import SessionConfig, StreamingSession
    from infmllm_ros.synthetic import generate_episode

    session = StreamingSession(SessionConfig(cache_policy="infmllm", quantization="none", cache_budget=96,
                                             recent_window=32, eviction_chunk=32, recall_store_mb=64))
    episode = generate_episode(3, 30.0)
    written = {}   # frame's first token -> per layer (keys, values, positions per head) as first written
    for second in range(16):
        first = session.cache.tokens_seen
        session.add_frame(episode.render(second + 0.5), stamp=float(second))
        end = session.cache.tokens_seen
        written[first] = []
        for layer in session.cache.layers:
            slots = ((layer.token_index >= first) & (layer.token_index < end)).nonzero()[:, 1].view(-1, end - first)
            written[first].append((layer.keys[0].gather(1, slots[..., None].expand(-1, -1, layer.keys.shape[-1])),
                                   layer.values[0].gather(1, slots[..., None].expand(-1, -1, layer.values.shape[-1])),
                                   layer.positions.gather(1, slots[..., None].expand(-1, -1, 3))))
    store, cache = session.cache.store, session.cache
    assert cache.evictions >= 3 and len(store) >= 3 and store.dropped == 0
    assert cache.length <= cache.policy.max_length
    stored = {frame.first_token for frame in store.frames}
    for frame in store.frames:
        assert frame.stamp == float(sorted(written).index(frame.first_token))
        for (keys, values, positions), back, kept_values in zip(written[frame.first_token], frame.keys, frame.values):
            base = positions.amin(dim=(1, 2))
            again = shift_rotated_keys(back, positions[..., 0], cache.inv_freq)   # each key turned back by its own
            torch.testing.assert_close(again, keys, atol=1e-4, rtol=1e-4)   # re-rotated a few times in fp32
            assert torch.equal(kept_values, values)
            assert torch.equal(frame.positions, positions[0] - base[0])
    for first in written:   # a frame not stored still has every token in every layer and head
        if first not in stored:
            end = first + store.frames[0].tokens
            for layer in cache.layers:
                inside = ((layer.token_index >= first) & (layer.token_index < end)).sum(dim=1)
                assert bool((inside == end - first).all())


def test_without_a_store_the_cache_registers_no_frames():
    from infmllm_ros.engine.session import SessionConfig, StreamingSession
    from infmllm_ros.synthetic import generate_episode

    session = StreamingSession(SessionConfig(cache_policy="infmllm", quantization="none", cache_budget=96,
                                             recent_window=32, eviction_chunk=32, recall_store_mb=0))
    episode = generate_episode(3, 30.0)
    for second in range(8):
        session.add_frame(episode.render(second + 0.5))
    assert session.cache.store is None and session.cache.unstored_frames == [] and session.cache.evictions >= 1
