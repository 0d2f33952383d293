"""Recall through real sessions of every supported family: evicted frames come back exactly (keys
re-rotated to their new positions, M-RoPE grids intact), leave again after the answer, stay within
budget + chunk + the recall allowance, and cost nothing when recall is off or nothing is stored."""

from __future__ import annotations

import pytest
import torch

from engine_helpers import frames, session_for
from infmllm_ros.engine.rope import shift_rotated_keys
from infmllm_ros.engine.session import DEFAULT_RECALL_STORE_MB, RECALL_AUTO, SessionConfig

RECALL = dict(recall_store_mb=8, recall_frames=2)


def stream_and_record(session, count: int) -> dict[int, list]:
    """Feed `count` frames; per frame's first stream token, each layer's (keys, values, positions)
    as they were written."""
    written = {}
    for index, image in enumerate(frames(count, seed=3)):
        first = session.cache.tokens_seen
        session.add_frame(image, stamp=float(index))
        written[first] = [slot_contents(layer, first, session.cache.tokens_seen) for layer in session.cache.layers]
    return written


def slot_contents(layer, first: int, end: int, recalled: bool | None = None):
    """(keys, values, positions) per head of stream tokens [first, end) in one layer, in slot order;
    `recalled` True/False: only the recalled copies / only the cached ones."""
    inside = (layer.token_index >= first) & (layer.token_index < end)
    if recalled is not None:
        inside &= (layer.segments < 0) if recalled else (layer.segments >= 0)
    slots = inside.nonzero()[:, 1].view(layer.keys.shape[1], -1)
    return (layer.keys[0].gather(1, slots[..., None].expand(-1, -1, layer.keys.shape[-1])),
            layer.values[0].gather(1, slots[..., None].expand(-1, -1, layer.values.shape[-1])),
            layer.positions.gather(1, slots[..., None].expand(-1, -1, 3)))


def snapshot(cache) -> list[tuple]:
    return [(layer.keys.clone(), layer.values.clone(), layer.positions.clone(), layer.token_index.clone())
            for layer in cache.layers]


@pytest.mark.parametrize("family", ["llava-llama", "qwen2_vl", "idefics3"])
def test_recalled_frames_are_the_evicted_ones_re_rotated_and_leave_after(tiny_model_dirs, family):
    session = session_for(tiny_model_dirs[family], "infmllm", **RECALL)
    written = stream_and_record(session, 30)
    cache, store = session.cache, session.cache.store
    assert len(store) >= 3 and cache.evictions >= 2
    chosen = [store.frames[0], store.frames[2]]
    before, length = snapshot(cache), cache.length

    cache.recall(chosen)
    assert cache.recalled_tokens == sum(frame.tokens for frame in chosen)
    assert cache.length == length + cache.recalled_tokens
    for frame in chosen:
        end = frame.first_token + frame.tokens
        for (keys, values, positions), layer in zip(written[frame.first_token], cache.layers):
            back_keys, back_values, back_positions = slot_contents(layer, frame.first_token, end, recalled=True)
            new_base = back_positions.amin(dim=(1, 2))
            old_base = positions.amin(dim=(1, 2))
            # the frame's own layout (an M-RoPE grid, or a run of positions) moved as one piece
            assert torch.equal(back_positions - new_base[:, None, None], positions - old_base[:, None, None])
            shift = (old_base - new_base)[:, None].expand(-1, back_keys.shape[1])
            torch.testing.assert_close(shift_rotated_keys(back_keys, shift, cache.inv_freq), keys,
                                       atol=1e-4, rtol=1e-4)
            assert torch.equal(back_values, values)
    for layer in cache.layers:   # each recalled frame sits, in one piece, where the stream put it
        recalled = layer.segments < 0
        for head in range(layer.keys.shape[1]):
            index = layer.token_index[head]
            for frame in chosen:
                slots = (recalled[head] & (index >= frame.first_token)
                         & (index < frame.first_token + frame.tokens)).nonzero()[:, 0]
                assert torch.equal(slots, torch.arange(int(slots[0]), int(slots[0]) + frame.tokens))
                before_it, after_it = index[:slots[0]][~recalled[head, :slots[0]]], index[slots[-1] + 1:]
                assert bool((before_it < frame.first_token).all())
                assert bool((after_it[~recalled[head, slots[-1] + 1:]] >= frame.first_token).all())
            cached = index[~recalled[head]]
            assert bool((cached[1:] > cached[:-1]).all()), "the cached tokens keep their order"

    cache.release_recalled()
    assert cache.recalled_tokens == 0 and cache.length == length
    for (keys, values, positions, index), layer in zip(before, cache.layers):
        assert torch.equal(layer.token_index, index) and torch.equal(layer.positions, positions)
        assert torch.equal(layer.values, values)
        torch.testing.assert_close(layer.keys, keys, atol=1e-4, rtol=1e-4)


def test_recall_with_nothing_stored_answers_exactly_as_recall_off(tiny_model_dirs):
    sessions = [session_for(tiny_model_dirs["qwen2_vl"], "infmllm", cache_budget=512, recent_window=64, **extra)
                for extra in ({}, RECALL)]
    answers = []
    for session in sessions:
        for index, image in enumerate(frames(6)):
            session.add_frame(image, stamp=float(index))
        answers.append([session.ask("what is in view ?"), session.ask("what colour ?")])
    off, on = sessions
    assert on.cache.store is not None and len(on.cache.store) == 0 and on.cache.evictions == 0
    assert [a.text for a in answers[0]] == [a.text for a in answers[1]]
    assert all(a.recalled_stamps == () for a in answers[1])
    for layer_off, layer_on in zip(off.cache.layers, on.cache.layers):
        assert torch.equal(layer_off.keys, layer_on.keys) and torch.equal(layer_off.positions, layer_on.positions)
        assert torch.equal(layer_off.attention_mass, layer_on.attention_mass)


def test_the_full_cache_ignores_the_default_recall_and_answers_as_without_it(tiny_model_dirs):
    """Recall is on by default (auto); under `full` nothing is evicted, so auto must not be refused
    (the default would then break `cache_policy: full`) nor cost anything: no store, no probe."""
    sessions = [session_for(tiny_model_dirs["llava-llama"], "full", **extra)
                for extra in ({}, {"recall_store_mb": RECALL_AUTO})]
    answers = []
    for session in sessions:
        for index, image in enumerate(frames(12)):
            session.add_frame(image, stamp=float(index))
        answers.append([session.ask("what is in view ?").text, session.ask("what colour ?").text])
    off, on = sessions
    assert not on.config.recall_on and on.cache.store is None and on.probe is None
    assert answers[0] == answers[1]
    for layer_off, layer_on in zip(off.cache.layers, on.cache.layers):
        assert torch.equal(layer_off.keys, layer_on.keys) and torch.equal(layer_off.values, layer_on.values)


def test_an_answer_with_recall_stays_within_the_allowance_and_leaves_no_trace(tiny_model_dirs):
    session = session_for(tiny_model_dirs["llava-llama"], "infmllm", max_new_tokens=6, **RECALL)
    for index, image in enumerate(frames(40)):
        session.add_frame(image, stamp=float(index))
    cache = session.cache
    allowance = RECALL["recall_frames"] * max(frame.tokens for frame in cache.store.frames)
    stored_stamps = {frame.stamp for frame in cache.store.frames}
    seen_before = cache.tokens_seen
    question = session.prompt.question.format(question="what is in view ?")
    question_tokens = session.tokenizer(question, add_special_tokens=False)["input_ids"]
    pieces, longest = session.stream("what is in view ?"), 0
    while True:
        try:
            next(pieces)
            longest = max(longest, cache.length)
            assert cache.recalled_tokens > 0, "the recalled frames stay for the whole answer"
        except StopIteration as done:
            answer = done.value
            break
    assert longest <= cache.policy.max_length + allowance
    assert len(answer.recalled_stamps) == RECALL["recall_frames"] and set(answer.recalled_stamps) <= stored_stamps
    assert cache.recalled_tokens == 0 and cache.length <= cache.policy.max_length
    assert all(bool((layer.segments >= 0).all()) for layer in cache.layers)
    # the question was fed twice (once to read its queries) but is in the stream once
    assert cache.tokens_seen - seen_before == len(question_tokens) + answer.tokens


def test_recall_reserves_its_room_and_skips_frames_still_mostly_cached(tiny_model_dirs):
    session = session_for(tiny_model_dirs["llava-llama"], "infmllm", **RECALL)
    for index, image in enumerate(frames(30)):
        session.add_frame(image, stamp=float(index))
    cache, store = session.cache, session.cache.store
    storage = [layer.key_store.store.data_ptr() for layer in cache.layers]
    answer = session.ask("what is in view ?")
    assert answer.recalled_stamps
    assert [layer.key_store.store.data_ptr() for layer in cache.layers] == storage, \
        "the recall allowance was reserved: no cache copy for a recalled answer"
    share = cache.cached_share(*store.spans())
    assert share.shape == (len(store),) and bool(((share >= 0) & (share <= 1)).all())
    recalled = {frame.first_token for frame in store.frames if frame.stamp in answer.recalled_stamps}
    firsts = store.spans()[0].tolist()
    # the kept share of the frames chosen, as they were then, was at most half (they went back after)
    assert all(float(share[firsts.index(first)]) <= 0.5 + 1e-6 for first in recalled)


def test_a_recall_that_fails_part_way_is_still_taken_out(tiny_model_dirs):
    session = session_for(tiny_model_dirs["llava-llama"], "infmllm", **RECALL)
    for index, image in enumerate(frames(30)):
        session.add_frame(image, stamp=float(index))
    cache = session.cache
    length = cache.length
    broken = list(cache.store.frames)[:1]
    assert len(cache.layers) >= 2
    broken[0] = type(broken[0])(stamp=None, first_token=broken[0].first_token, keys=broken[0].keys[:1],
                                values=broken[0].values[:1], positions=broken[0].positions)   # the first layer only
    with pytest.raises(IndexError):
        cache.recall(broken)
    cache.release_recalled()
    assert cache.recalled_tokens == 0 and all(layer.length == length for layer in cache.layers)
    assert all(bool((layer.segments >= 0).all()) for layer in cache.layers)


def test_an_eviction_while_frames_are_recalled_takes_them_out_first(tiny_model_dirs):
    session = session_for(tiny_model_dirs["llava-llama"], "infmllm", **RECALL)
    for index, image in enumerate(frames(30)):
        session.add_frame(image, stamp=float(index))
    cache = session.cache
    cache.recall(list(cache.store.frames)[:2])
    evictions = cache.evictions
    for index, image in enumerate(frames(6, seed=9)):
        session.add_frame(image, stamp=100.0 + index)
    assert cache.evictions > evictions and cache.recalled_tokens == 0
    assert cache.length <= cache.policy.max_length
    assert all(bool((layer.segments >= 0).all()) for layer in cache.layers)


def test_recall_settings_are_checked():
    assert SessionConfig().recall_on and SessionConfig().store_megabytes == DEFAULT_RECALL_STORE_MB, "on by default"
    assert not SessionConfig(cache_policy="full").recall_on, "auto: the full cache evicts nothing to recall"
    assert not SessionConfig(recall_store_mb=0).recall_on and not SessionConfig(recall_frames=0).recall_on
    assert SessionConfig(cache_policy="full").sized(17).recall_store_mb == 0.0
    with pytest.raises(ValueError, match="full cache evicts none"):   # asked for explicitly: meaningless
        SessionConfig(cache_policy="full", recall_store_mb=8)
    with pytest.raises(ValueError, match=">= 0"):
        SessionConfig(recall_store_mb=-2)
    with pytest.raises(ValueError, match=">= 0"):
        SessionConfig(recall_frames=-2)


def test_the_question_probe_reads_queries_after_a_query_norm():
    """Qwen3-style attention normalises each head's query before RoPE (q_norm) and stores keys after
    k_norm: the probe must score with the normalised queries, or they would not be alike."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from infmllm_ros.engine.probe import QueryProbe

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)).eval()
    for layer in model.model.layers:   # norms that are not the identity, so skipping them shows
        torch.nn.init.uniform_(layer.self_attn.q_norm.weight, 0.5, 2.0)
    inputs = {}
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda module, args, kwargs, number=number: inputs.__setitem__(number, kwargs["hidden_states"]),
        with_kwargs=True) for number, layer in enumerate(model.model.layers)]
    probe = QueryProbe(model)
    with torch.no_grad(), probe.attached():
        model(torch.arange(10).unsqueeze(0))
    for hook in hooks:
        hook.remove()
    for number, layer in enumerate(model.model.layers):
        attention = layer.self_attn
        projected = attention.q_proj(inputs[number]).view(1, 10, 4, 16)[0, -1]
        expected = attention.q_norm(projected)
        got = probe.grouped()[number]
        assert got.shape == (2, 2, 16)
        torch.testing.assert_close(got.reshape(4, 16), expected.detach())
        assert not torch.allclose(got.reshape(4, 16), projected.detach(), atol=1e-3)
