"""Temporal token pruning through real sessions: a repeated picture appends only its text tokens, the kept
tokens sit at the positions a whole frame gives them (M-RoPE grids intact), nothing pruned means exactly
the unpruned stream, and the selection compares each patch with what it last appended."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_helpers import frames, session_for
from infmllm_ros.engine.pruning import TemporalPruner
from infmllm_ros.engine.session import SessionConfig

IMAGE = 7   # the image token id of the selection unit tests
QUESTION = "what is in view ?"


def visual_count(session) -> int:
    """Visual tokens one frame of the test size takes in this model."""
    inputs = session.processor(text=session.prompt.frame, images=[frames(1)[0]], return_tensors="pt")
    return int((inputs["input_ids"] == session.model.config.image_token_id).sum())


@pytest.mark.parametrize("family", ["llava-llama", "qwen2_vl", "qwen2_5_vl", "idefics3"])
def test_a_repeated_picture_appends_only_its_text_tokens(tiny_model_dirs, family):
    session = session_for(tiny_model_dirs[family], "full", prune_similarity=0.99)
    picture = frames(1, seed=5)[0]
    first = session.add_frame(picture, stamp=0.0)
    again = [session.add_frame(picture.copy(), stamp=float(t)) for t in range(1, 4)]
    visual = visual_count(session)
    assert first.pruned == 0
    assert all(step.pruned == visual and step.tokens == first.tokens - visual for step in again)
    assert session.cache.tokens_seen == first.tokens + sum(step.tokens for step in again)
    assert session.pruner.pruned_tokens == 3 * visual

    session.reset()   # a new stream: the next frame is whole again
    assert session.add_frame(picture, stamp=10.0).pruned == 0


class EveryOtherPatch(TemporalPruner):
    """Leaves out every second visual token of every frame but the first: a partly pruned frame on
    demand, whatever the random tiny tower makes of the pictures."""

    def select(self, input_ids, embeddings):
        keep = super().select(input_ids, embeddings)
        keep[:] = True
        if self.frames:   # frames committed so far
            visual = (input_ids[0] == self.image_token_id).nonzero()[:, 0]
            keep[visual[1::2]] = False
        self.pending.keep, self.pending.changed = keep, keep[self.pending.visual]
        return keep


@pytest.mark.parametrize("family", ["llava-llama", "qwen2_vl"])
def test_kept_tokens_sit_where_the_whole_frame_puts_them(tiny_model_dirs, family):
    """Partly pruned frames: the pruned stream's tokens have exactly the positions (all three M-RoPE
    axes) the same tokens have in the unpruned stream, and what follows starts where it does."""
    whole = session_for(tiny_model_dirs[family], "full")
    pruned = session_for(tiny_model_dirs[family], "full", prune_similarity=0.99)
    pruned.pruner = EveryOtherPatch(0.99, pruned.model.config.image_token_id)
    for session in (whole, pruned):
        for index, picture in enumerate(frames(4, seed=9)):
            session.add_frame(picture, stamp=float(index))
        session.add_text(QUESTION)
    asked = len(whole.tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
    left_out = 3 * (visual_count(whole) // 2)
    assert pruned.cache.length == whole.cache.length - left_out
    for whole_layer, pruned_layer in zip(whole.cache.layers, pruned.cache.layers):
        # token_index counts appended tokens only, so tokens are matched by their (t, h, w) position
        whole_positions = [tuple(p) for p in whole_layer.positions[0].tolist()]
        pruned_positions = [tuple(p) for p in pruned_layer.positions[0].tolist()]
        assert len(set(whole_positions)) == len(whole_positions)
        assert set(pruned_positions) <= set(whole_positions)
        assert pruned_positions == sorted(pruned_positions, key=whole_positions.index), "in stream order"
        assert pruned_positions[-asked:] == whole_positions[-asked:], "the text after the frames is where it was"
    assert pruned.cache.next_position == whole.cache.next_position


def test_nothing_pruned_is_exactly_the_unpruned_stream(tiny_model_dirs):
    """Threshold 1: only a patch identical to what it last appended is left out, and random frames have
    none, so the embeddings path must give the same keys, values and answers as the model's own."""
    sessions = [session_for(tiny_model_dirs["qwen2_vl"], "infmllm", **extra)
                for extra in ({}, {"prune_similarity": 1.0})]
    answers = []
    for session in sessions:
        for index, image in enumerate(frames(12, seed=4)):
            session.add_frame(image, stamp=float(index))
        answers.append(session.ask("what is in view ?").text)
    plain, pruned = sessions
    assert pruned.pruner.pruned_tokens == 0 and plain.cache.evictions > 0
    assert answers[0] == answers[1]
    for a, b in zip(plain.cache.layers, pruned.cache.layers):
        assert torch.equal(a.positions, b.positions) and torch.equal(a.token_index, b.token_index)
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


def test_pruned_stream_stays_within_budget_with_recall(tiny_model_dirs):
    session = session_for(tiny_model_dirs["llava-llama"], "infmllm", prune_similarity=0.95, recall_store_mb=8,
                          recall_frames=2)
    still = frames(1, seed=2)[0]
    for index in range(60):   # a static camera with a change every tenth frame
        picture = frames(1, seed=100 + index)[0] if index % 10 == 0 else still
        session.add_frame(picture, stamp=float(index))
        assert session.cache.length <= session.policy.budget + session.policy.chunk
    answer = session.ask("what is in view ?")
    assert session.pruner.pruned_tokens > 0 and len(session.cache.store) > 0 and answer.recalled_stamps
    assert session.cache.length <= session.policy.budget + session.policy.chunk


def unit(*rows) -> torch.Tensor:
    """Embeddings (1, n, 2) of unit vectors at the given angles (degrees)."""
    angles = torch.tensor(rows, dtype=torch.float64) * torch.pi / 180
    return torch.stack([angles.cos(), angles.sin()], dim=-1).float()[None]


def appended(pruner: TemporalPruner, ids: torch.Tensor, embeddings: torch.Tensor) -> list[bool]:
    """One frame through the pruner as the session does: select, then commit after a forward."""
    keep = pruner.select(ids, embeddings)
    pruner.commit(first_token=0 if pruner.appended_at is None else int(pruner.appended_at.max()) + 10)
    return keep.tolist()


IDS = torch.tensor([[1, IMAGE, IMAGE, 2]])   # text, two patches, text
TEN_DEGREES = float(np.cos(np.radians(10)))


def test_selection_compares_with_the_last_appended_embedding_so_drift_is_caught():
    pruner = TemporalPruner(threshold=TEN_DEGREES, image_token_id=IMAGE)
    assert appended(pruner, IDS, unit(0, 0, 0, 0)) == [True, True, True, True]
    # patch 1 drifts 6 degrees a frame: pruned at 6, sent again at 12 (12 from what was appended), then
    # pruned at 18 (6 from 12); patch 2 jumps once and is sent once
    assert appended(pruner, IDS, unit(0, 6, 0, 0)) == [True, False, False, True]
    assert appended(pruner, IDS, unit(0, 12, 45, 0)) == [True, True, True, True]
    assert appended(pruner, IDS, unit(0, 18, 45, 0)) == [True, False, False, True]
    assert (pruner.frames, pruner.visual_tokens, pruner.pruned_tokens) == (4, 8, 4)
    # a frame of another size (a camera that changed resolution) is appended whole
    assert appended(pruner, torch.tensor([[IMAGE, 1]]), unit(18, 0)) == [True, True]


def test_a_patch_whose_token_was_evicted_is_sent_again_and_nothing_counts_before_commit():
    pruner = TemporalPruner(threshold=TEN_DEGREES, image_token_id=IMAGE)
    appended(pruner, IDS, unit(0, 0, 0, 0))
    assert pruner.appended_at.tolist() == [1, 2], "stream indices of the patches' tokens"
    pruner.forget(torch.tensor([False, True]))
    assert appended(pruner, IDS, unit(0, 0, 0, 0)) == [True, False, True, True], "only the evicted patch again"
    assert pruner.appended_at.tolist() == [1, 13]
    assert appended(pruner, IDS, unit(0, 0, 0, 0)) == [True, False, False, True]
    before = (pruner.reference.clone(), pruner.appended_at.clone(), pruner.frames)
    pruner.select(IDS, unit(0, 45, 45, 0))   # a forward that then fails: no commit
    assert torch.equal(pruner.reference, before[0]) and torch.equal(pruner.appended_at, before[1])
    assert pruner.frames == before[2]


def test_at_threshold_one_an_identical_patch_is_left_out():
    """float32 puts a vector's cosine with itself a little below 1; 1.0 must still mean "identical"."""
    pruner = TemporalPruner(threshold=1.0, image_token_id=IMAGE)
    features = torch.randn(1, 4, 64)
    appended(pruner, IDS, features)
    assert appended(pruner, IDS, features.clone()) == [True, False, False, True]


def test_by_frame_a_frame_goes_whole_or_not_at_all():
    pruner = TemporalPruner(threshold=TEN_DEGREES, image_token_id=IMAGE, whole_frames=True)
    assert appended(pruner, IDS, unit(0, 0, 0, 0)) == [True] * 4
    assert appended(pruner, IDS, unit(0, 6, 0, 0)) == [False] * 4, "nothing moved enough: text left out too"
    # one patch moved 12 degrees from what was appended: the frame goes whole, every reference renewed,
    # so the other patch's 5 degrees of drift are measured from here on
    assert appended(pruner, IDS, unit(0, 12, 5, 0)) == [True] * 4
    assert appended(pruner, IDS, unit(0, 12, 14, 0)) == [False] * 4


def test_a_frame_left_out_whole_leaves_a_gap_of_its_positions(tiny_model_dirs):
    whole = session_for(tiny_model_dirs["qwen2_vl"], "full")
    pruned = session_for(tiny_model_dirs["qwen2_vl"], "full", prune_similarity=0.99, prune_unit="frame")
    still, moved = frames(2, seed=6)
    steps = {}
    for session in (whole, pruned):
        steps[session] = [session.add_frame(picture, stamp=float(t))
                          for t, picture in enumerate([still, still.copy(), moved])]
        session.add_text(QUESTION)
    skipped, first = steps[pruned][1], steps[whole][0]
    assert (skipped.tokens, skipped.pruned) == (0, first.tokens), "the repeated frame left out whole"
    assert pruned.cache.length == whole.cache.length - first.tokens
    assert pruned.cache.next_position == whole.cache.next_position
    kept = {tuple(p) for p in pruned.cache.layers[0].positions[0].tolist()}
    assert kept <= {tuple(p) for p in whole.cache.layers[0].positions[0].tolist()}


@pytest.mark.parametrize("unit_", ["token", "frame"])
@pytest.mark.parametrize("policy", ["streaming", "infmllm"])
def test_a_still_scene_stays_in_a_bounded_cache(tiny_model_dirs, policy, unit_):
    """Pruned patches lean on the copy appended earlier; when the policy evicts that copy the patch
    must be sent again, or a camera that stops moving vanishes from the cache."""
    session = session_for(tiny_model_dirs["llava-llama"], policy, prune_similarity=0.99, prune_unit=unit_)
    moving = frames(10, seed=8)
    still = frames(1, seed=9)[0]
    for index, picture in enumerate(moving):
        session.add_frame(picture, stamp=float(index))
    first_still = session.cache.tokens_seen
    for index in range(60):
        session.add_frame(still.copy(), stamp=10.0 + index)
        session.add_text(QUESTION)   # questions and answers fill the cache as the scene stands still
    assert session.cache.evictions > 10 and session.pruner.pruned_tokens > 0
    visual = session.pruner.visual_tokens // session.pruner.frames
    for layer in session.cache.layers:
        for head in range(layer.keys.shape[1]):
            index = layer.token_index[head]
            held = set(index[index >= first_still].tolist()) & set(session.pruner.appended_at.tolist())
            assert len(held) >= visual // 2, "most patches of the still scene are in the cache"


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_prune_similarity_out_of_range_is_a_configuration_error(value):
    with pytest.raises(ValueError, match="prune_similarity"):
        SessionConfig(prune_similarity=value)
    with pytest.raises(ValueError, match="prune_similarity"):
        TemporalPruner(value, IMAGE)


def test_unknown_prune_unit_is_a_configuration_error():
    with pytest.raises(ValueError, match="prune_unit"):
        SessionConfig(prune_similarity=0.9, prune_unit="patch")
