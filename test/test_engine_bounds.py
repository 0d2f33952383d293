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
