"""Scattered training windows: every seen-once object askable at the question's time is shown,
among runs of the minutes between, and the positions run as if the whole stream had been fed."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from infmllm_ros.synthetic import corpus_text, generate_episode, generate_questions
from infmllm_ros.tiny_model.architecture import IMAGE_TOKENS, train_tokenizer
from infmllm_ros.tiny_model.data import (FRAME_TOKENS, TOKENS_PER_SECOND, build_sequence, sample_window,
                                         side_candidates)
from infmllm_ros.tiny_model.streams import RenderedStream, frame_objects


def _stream(seed: int = 100_003, duration: float = 300.0) -> RenderedStream:
    episode = generate_episode(seed, duration)
    times = 0.5 + np.arange(int(duration))
    stream = RenderedStream(seed, times, [frame_objects(episode, float(t)) for t in times],
                            generate_questions(episode, seed, spacing_s=1.0))
    stream.features = torch.zeros(len(times), IMAGE_TOKENS, 8, dtype=torch.float16)
    return stream


def test_a_scattered_window_shows_every_object_askable_where_it_ends():
    stream = _stream()
    assert any(q.family == "distant" for q in stream.questions)
    rng = random.Random(0)
    for _ in range(6):
        window = sample_window(stream, rng, 80, scattered=True, offset_share=0.0)
        segments = window.segments
        assert len(segments) > 2
        assert all(a < b for a, b in segments) and all(b0 < a1 for (_, b0), (a1, _) in zip(segments, segments[1:]))
        frames = np.array(window.frames)
        assert 40 <= len(frames) <= 80 + 3
        shown = stream.frame_times[frames]
        last = frames[-1]
        reachable = [q for q in side_candidates(stream)[last] if q.family in ("distant", "long")]
        assert any(q.family == "distant" for q in reachable)
        for question in reachable:
            t_enter, t_exit = question.evidence
            assert ((shown >= t_enter) & (shown < t_exit)).any(), question


def test_scattered_sequences_keep_stream_positions_and_ask_distant_questions():
    stream = _stream()
    tokenizer = train_tokenizer(corpus_text(range(5)))
    rng = random.Random(1)
    window = sample_window(stream, rng, 80, scattered=True, offset_share=0.0)
    batch = build_sequence(stream, window, tokenizer, side_questions=48, rng=rng)
    assert "distant" in batch["side_families"]
    is_stream = batch["branches"][0] < 0
    positions = batch["position_ids"][0][is_stream]
    assert bool((positions[1:] > positions[:-1]).all())
    # the last frame sits about where a fully fed stream puts it (gaps scale by 0.8-1.25)
    frame_starts = positions[batch["input_ids"][0][is_stream] == tokenizer.convert_tokens_to_ids("<frame>")]
    elapsed = stream.frame_times[window.frames[-1]] - stream.frame_times[window.frames[0]]
    assert 0.75 * elapsed * TOKENS_PER_SECOND <= int(frame_starts[-1]) <= 1.3 * elapsed * TOKENS_PER_SECOND
    assert len(batch["input_ids"][0][is_stream]) < elapsed * FRAME_TOKENS   # the minutes between are skipped


def test_each_phase_draws_its_own_windows_and_has_its_own_cycle(monkeypatch):
    """One command trains every phase: scattered windows only in the long phases (when the first
    phase has none), at LONG_PHASE_MIX's share; short windows only in a round's drill; each phase's
    learning-rate cycle has the same shape and peaks at its own flag (the rates a run used are
    checked in test_training.py)."""
    from infmllm_ros.tiny_model import schedule, train

    drawn = []
    monkeypatch.setattr(train, "sample_window",
                        lambda stream, rng, frames, **kind: drawn.append({"frames": frames, **kind}) or None)
    args = train.parse_args(["--steps", "100", "--long-steps", "50", "--rounds", "2", "--drill-steps", "30",
                             "--round-steps", "40", "--retrieval-weight", "1.0"])
    phases = schedule.plan(args)
    assert [(p.name, p.start, p.steps) for p in phases] == [
        ("first", 0, 100), ("long", 100, 50), ("drill 1", 150, 30), ("fine-tune 1", 180, 40),
        ("drill 2", 220, 30), ("fine-tune 2", 250, 40)]
    assert schedule.total_steps(phases) == 290 and schedule.phase_at(phases, 289).name == "fine-tune 2"
    drill, fine_tune = schedule.phase_at(phases, 150), schedule.phase_at(phases, 180)
    assert drill.side_kinds == {"colour_of_shape", "colour_of_shape_earlier"} and drill.retrieval_weight == 2.0
    assert fine_tune.balance_kinds and not fine_tune.side_kinds and fine_tune.retrieval_weight == 1.0
    assert not phases[0].balance_kinds and not phases[0].side_kinds   # the first phases keep their flags
    streams = train.Streams({"train": [_stream()], "validation": []})
    rng = random.Random(0)

    def shares(step):
        drawn.clear()
        for _ in range(2000):
            train.next_window(args, schedule.phase_at(phases, step), step, streams, rng)
        return [sum(kind.get(name, False) for kind in drawn) / len(drawn) for name in ("scattered", "gapped")]

    scattered, gapped = shares(60)
    assert scattered == 0.0 and 0.3 < gapped < 0.4
    for step in (120, 200):   # the long phase and a round's fine-tune
        scattered, gapped = shares(step)
        assert abs(scattered - train.LONG_PHASE_MIX[1]) < 0.04 and abs(gapped - train.LONG_PHASE_MIX[0]) < 0.03
    assert shares(160) == [0.0, 0.0] and max(kind["frames"] for kind in drawn) <= 32   # a drill: short only
    # each phase's cycle: linear warm-up over a 40th of its steps, then cosine down to a tenth
    assert abs(schedule.cycle(0, 400) - 0.1) < 0.01 and schedule.cycle(9, 400) > 0.99
    assert abs(schedule.cycle(400, 400) - 0.1) < 1e-9
    assert schedule.learning_rate(phases, 150 + 5) == pytest.approx(args.drill_lr * schedule.cycle(5, 30))
    assert schedule.learning_rate(phases, 180 + 5) == pytest.approx(args.long_lr * schedule.cycle(5, 40))
    # each phase peaks at its own flag: a frozen first phase leaves the long phase its rate
    frozen = schedule.plan(train.parse_args(["--lr", "0", "--steps", "400", "--long-steps", "400",
                                             "--long-lr", "1e-4"]))
    assert schedule.learning_rate(frozen, 399) == 0.0
    assert schedule.learning_rate(frozen, 400 + 9) == pytest.approx(1e-4 * schedule.cycle(9, 400))
    # rounds alone (a warm start's chain): the zero-step phases are left out
    only_rounds = schedule.plan(train.parse_args(["--steps", "0", "--long-steps", "0", "--rounds", "1"]))
    assert [p.name for p in only_rounds] == ["drill 1", "fine-tune 1"] and only_rounds[0].start == 0


def test_schedule_flags_are_checked(capsys):
    from infmllm_ros.tiny_model import train

    for argv, said in ((["--steps", "0", "--long-steps", "0"], "nothing to train"),
                       (["--rounds", "-1"], "negative"),
                       (["--rounds", "1", "--drill-kinds", "colour_of_shap"], "--drill-kinds: unknown kind")):
        with pytest.raises(SystemExit):
            train.parse_args(argv)
        assert said in capsys.readouterr().err


def test_validation_reads_distant_answers_from_several_scattered_windows_per_long_stream():
    """One scattered window per stream held 12 distant questions over six streams; the validation
    now draws SCATTERED_VALIDATION_WINDOWS per stream, different windows, the first the old one."""
    from infmllm_ros.tiny_model import train
    stream = _stream()
    windows = train.validation_windows(train.Streams({"train": [], "validation": [stream]}))
    scattered = [window for _, window in windows if len(window.segments) > 2]
    assert len(scattered) == train.SCATTERED_VALIDATION_WINDOWS > 1
    assert len({tuple(window.segments) for window in scattered}) == len(scattered)
    first = sample_window(stream, random.Random(stream.seed), 128, scattered=True, offset_share=0.0)
    assert scattered[0].segments == first.segments
