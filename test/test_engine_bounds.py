"""Structural bounds over long streams: the cache never passes budget + chunk, memory stays flat."""

from __future__ import annotations

import pytest

from engine_helpers import frames, session_for

STREAM = 2000


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["streaming", "h2o", "infmllm"])
def test_cache_bounded_over_2000_frames(tiny_model_dirs, policy):
    session = session_for(tiny_model_dirs["llava-llama"], policy, cache_budget=48, recent_window=16,
                          eviction_chunk=16)
    pool = frames(16, seed=7)
    bound = session.policy.max_length
    longest, bytes_after_warmup = 0, []
    for index in range(STREAM):
        step = session.add_frame(pool[index % len(pool)], stamp=float(index))
        longest = max(longest, session.cache_tokens)
        if index >= 100 and step.evicted:
            bytes_after_warmup.append(session.cache_bytes)   # an eviction plus one frame
        if index % 500 == 499:
            session.ask("what is in view ?")
    assert longest <= bound, f"cache reached {longest} tokens, bound {bound}"
    assert session.cache.evictions > 100
    assert bytes_after_warmup and max(bytes_after_warmup) == min(bytes_after_warmup), "cache bytes grew"
    assert all(layer.length == session.cache.length for layer in session.cache.layers)
    assert session.cache.next_position <= bound, "positions stay within what the model was trained on"
    assert session.cache.tokens_seen > 10 * bound


def test_full_cache_grows(tiny_model_dirs):
    """The reference: without eviction, memory grows with the stream (what the others prevent)."""
    session = session_for(tiny_model_dirs["llava-llama"], "full")
    sizes = []
    for image in frames(40):
        session.add_frame(image)
        sizes.append(session.cache_bytes)
    assert sizes[-1] > 5 * sizes[4]


def test_kept_share_follows_what_each_policy_keeps(tiny_model_dirs):
    """The evidence measure the quality benchmark reports: all of it under `full`; under a window,
    nothing of an early frame (past the sinks) and all of the newest one."""
    spans = {}
    sessions = {policy: session_for(tiny_model_dirs["llava-llama"], policy) for policy in ("full", "streaming")}
    for policy, session in sessions.items():
        for index, image in enumerate(frames(30)):
            start = session.cache.tokens_seen
            session.add_frame(image)
            spans.setdefault(policy, []).append((start, session.cache.tokens_seen))
    full, window = sessions["full"], sessions["streaming"]
    assert full.cache.kept_share(spans["full"][2:4]) == 1.0
    assert window.cache.kept_share(spans["streaming"][2:4]) == 0.0
    assert window.cache.kept_share(spans["streaming"][-1:]) == 1.0
    assert 0.0 < window.cache.kept_share(spans["streaming"]) < 1.0


def test_score_tokens_matches_token_by_token_decoding(tiny_model_dirs):
    """Scoring a chunk at once gives each position the logits one-token-at-a-time feeding gives."""
    import torch
    chunked, stepwise = (session_for(tiny_model_dirs["llava-llama"], "infmllm") for _ in range(2))
    for session in (chunked, stepwise):
        session.add_frame(frames(1)[0])
    ids = chunked.tokenizer("what is in view ?", add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    rows = chunked.score_tokens(ids)
    assert rows.shape == (ids.numel(), stepwise.model.config.get_text_config().vocab_size)
    for k, token in enumerate(ids.tolist()):
        torch.testing.assert_close(rows[k], stepwise.feed_token(token), rtol=1e-4, atol=1e-4)


def test_keys_and_values_are_written_in_place_not_copied_per_token(tiny_model_dirs):
    """A bounded cache reserves budget + chunk once: frames, evictions and decoded tokens all write
    into the same storage (no per-token copy of the whole cache, as torch.cat would make)."""
    session = session_for(tiny_model_dirs["llava-llama"], "infmllm", cache_budget=48, recent_window=16,
                          eviction_chunk=16)
    pool = frames(4, seed=3)
    session.add_frame(pool[0])
    layer = session.cache.layers[0]
    storage = (layer.key_store.store.data_ptr(), layer.value_store.store.data_ptr())
    assert layer.key_store.store.shape[2] == session.policy.max_length
    for index in range(1, 30):
        session.add_frame(pool[index % len(pool)])
    session.ask("what is in view ?")
    assert session.cache.evictions > 3
    assert (layer.key_store.store.data_ptr(), layer.value_store.store.data_ptr()) == storage
    assert layer.keys.data_ptr() == storage[0] and layer.keys.shape[2] == session.cache_tokens


def test_full_cache_storage_grows_by_doubling(tiny_model_dirs):
    session = session_for(tiny_model_dirs["llava-llama"], "full")
    reallocations, last = 0, None
    for image in frames(40):
        session.add_frame(image)
        pointer = session.cache.layers[0].key_store.store.data_ptr()
        reallocations += pointer != last
        last = pointer
    tokens = session.cache_tokens
    assert session.cache.layers[0].key_store.store.shape[2] < 2 * tokens + 64
    assert reallocations <= 2 + tokens.bit_length()   # amortised: O(log tokens) copies, not one per frame


@pytest.mark.slow
def test_recall_store_and_cache_stay_bounded_over_a_long_stream(tiny_model_dirs):
    """1,200 frames (20 minutes at 1 Hz; the store is full after ~90) with recall on: the store never
    passes recall_store_mb (oldest frames leave), the cache never passes budget + chunk, nor + the
    recall allowance while an answer has frames back. (An hour took 3.5 min here: too long for CI.)"""
    session = session_for(tiny_model_dirs["llava-llama"], "infmllm", cache_budget=48, recent_window=16,
                          eviction_chunk=16, recall_store_mb=0.05, recall_frames=2)
    pool = frames(16, seed=7)
    store, cache = session.cache.store, session.cache
    allowance = 2 * session.frame_tokens
    for index in range(1200):
        session.add_frame(pool[index % len(pool)], stamp=float(index))
        assert store.bytes <= store.capacity_bytes and cache.length <= cache.policy.max_length
        if index % 300 == 299:
            pieces = session.stream("what is in view ?")
            for _ in pieces:
                assert cache.length <= cache.policy.max_length + allowance
            assert cache.recalled_tokens == 0
    assert store.dropped > 100 and len(store) > 0 and store.added == store.dropped + len(store)
