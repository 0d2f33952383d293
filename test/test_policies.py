"""Each policy keeps exactly the tokens a brute-force reference says it should."""

from __future__ import annotations

import pytest
import torch

from infmllm_ros.engine.policies import (AttentionSaddles, FullCache, HeavyHitters, StreamingWindow, make_policy,
                                         policy_settings)


def brute_force_keep(scores: list[float], length: int, budget: int, sink: int, recent: int) -> set[int]:
    """Sinks, the recent window, then the best-scoring candidates (newer wins ties), by loops."""
    keep = set(range(min(sink, length))) | set(range(max(length - recent, sink), length))
    candidates = [i for i in range(length) if i not in keep]
    ranked = sorted(candidates, key=lambda i: (-scores[i], -i))
    return keep | set(ranked[: budget - len(keep)])


def neighbourhood_sums(mass: list[float], width: int) -> list[float]:
    half = width // 2
    return [sum(mass[j] for j in range(i - half, i + half + 1) if 0 <= j < len(mass)) for i in range(len(mass))]


def hand_built_mass(length: int = 48) -> torch.Tensor:
    """Two KV heads with different patterns: a saddle cluster, lone spikes and background noise."""
    generator = torch.Generator().manual_seed(0)
    mass = torch.rand(2, length, generator=generator) * 0.01
    mass[0, 10:13] = torch.tensor([0.5, 0.9, 0.6])  # a cluster: one object's patches
    mass[0, 25] = 0.7                                # a lone saddle
    mass[1, 5] = 1.2
    mass[1, 30:32] = 0.8
    return mass


def test_infmllm_keeps_saddles_and_recent_window_exactly():
    policy = AttentionSaddles(budget=20, chunk=4, sink=2, recent=6, pool=3, attention_bias=0.2)
    mass = hand_built_mass()
    length = mass.shape[1]
    keep = policy.keep_indices(mass, length, kv_heads=2)
    assert keep.shape == (2, 20)
    for head in range(2):
        expected = brute_force_keep(neighbourhood_sums(mass[head].tolist(), 3), length, 20, 2, 6)
        assert set(keep[head].tolist()) == expected
        assert set(range(length - 6, length)) <= expected, "recent window intact"
        assert {0, 1} <= expected, "sinks kept"
    assert {10, 11, 12, 25} <= set(keep[0].tolist()), "saddles of head 0 kept"
    assert {5, 30, 31} <= set(keep[1].tolist()), "saddles of head 1 kept"
    background = [i for i in range(2, length - 6) if mass[0, i] < 0.02 and not 9 <= i <= 13 and not 24 <= i <= 26]
    evicted = set(range(length)) - set(keep[0].tolist())
    assert evicted and evicted <= set(background), "only low-attention tokens were evicted"


def test_infmllm_local_sum_saves_a_cluster_that_per_token_ranking_splits():
    """Three moderate keys of one object outrank a lone key with more mass than any one of them,
    while H2O's per-token ranking keeps the lone key and breaks the cluster."""
    mass = torch.zeros(1, 30)
    mass[0, 8:11] = 0.4      # cluster: local sums 0.8, 1.2, 0.8
    mass[0, 18] = 0.5        # lone key: local sums 0.5 around it
    saddles = AttentionSaddles(budget=7, chunk=1, sink=0, recent=4, pool=3)
    assert set(saddles.keep_indices(mass, 30, 1)[0].tolist()) == {8, 9, 10, 26, 27, 28, 29}
    heavy = HeavyHitters(budget=7, chunk=1, recent=4)
    assert set(heavy.keep_indices(mass, 30, 1)[0].tolist()) == {9, 10, 18, 26, 27, 28, 29}


def test_attention_bias_decays_old_evidence():
    policy = AttentionSaddles(budget=8, sink=0, recent=4, attention_bias=0.25)
    running = torch.ones(2, 8)
    assert torch.equal(policy.after_eviction(running), torch.full((2, 8), 0.75))
    assert torch.equal(HeavyHitters(budget=8, recent=4).after_eviction(running), running)


def test_h2o_keeps_heavy_hitters_exactly():
    policy = HeavyHitters(budget=16, chunk=4, recent=5)
    mass = hand_built_mass()
    keep = policy.keep_indices(mass, mass.shape[1], kv_heads=2)
    for head in range(2):
        expected = brute_force_keep(mass[head].tolist(), mass.shape[1], 16, 0, 5)
        assert set(keep[head].tolist()) == expected


def test_streaming_keeps_sinks_and_window():
    policy = StreamingWindow(budget=12, chunk=4, sink=4)
    keep = policy.keep_indices(None, 50, kv_heads=3)
    expected = list(range(4)) + list(range(42, 50))
    assert keep.tolist() == [expected] * 3


def test_full_never_evicts():
    policy = FullCache(budget=4)
    assert not policy.must_evict(10**9, 10**6)


def test_amortised_eviction_bound():
    policy = make_policy("infmllm", budget=100, chunk=16, recent=32)
    assert policy.max_length == 116
    assert not policy.must_evict(100, 16) and policy.must_evict(101, 16)


@pytest.mark.parametrize("settings", [dict(budget=10, sink=4, recent=8), dict(budget=10, chunk=0),
                                      dict(budget=64, pool=4), dict(budget=64, attention_bias=1.5)])
def test_invalid_settings_are_rejected(settings):
    with pytest.raises(ValueError):
        make_policy("infmllm", **settings)


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="streaming"):
        make_policy("lru")


def test_a_policy_takes_only_the_settings_it_has():
    """Each policy's dataclass fields are its settings: one it lacks is refused, never overwritten."""
    with pytest.raises(ValueError, match="sink"):
        make_policy("streaming", budget=12, recent=8)   # the window is budget - sink, not a setting
    with pytest.raises(ValueError, match="recent"):
        make_policy("full", recent=8)
    assert make_policy("streaming", budget=12, sink=2).kept_recent == 10
    assert HeavyHitters(budget=16, recent=5).kept_sink == 0
    offered = dict(budget=64, chunk=8, recent=16, sink=2, attention_bias=0.5)
    assert policy_settings("h2o", offered) == dict(budget=64, chunk=8, recent=16)
    assert policy_settings("streaming", offered) == dict(budget=64, chunk=8, sink=2)
    assert policy_settings("infmllm", offered) == offered
