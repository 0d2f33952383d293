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


def test_the_long_phase_draws_mostly_scattered_windows_and_each_phase_has_its_cycle(monkeypatch):
    """One command trains both phases: scattered windows only after --steps (when the first phase
    has none), at LONG_PHASE_MIX's share; each phase's learning-rate cycle has the same shape and
    peaks at its own flag (the rates a run used are checked in test_training.py)."""
    from argparse import Namespace

    from infmllm_ros.tiny_model import train

    drawn = []
    monkeypatch.setattr(train, "sample_window", lambda stream, rng, frames, **kind: drawn.append(kind) or None)
    args = Namespace(steps=100, long_steps=50, short_share=0.3, gapped_share=0.35, scattered_share=0.0,
                     max_frames=64, scattered_frames=160, short_stream_share=0.5)
    streams = train.Streams({"train": [_stream()], "validation": []})
    rng = random.Random(0)

    def shares(step):
        drawn.clear()
        for _ in range(2000):
            train.next_window(args, step, streams, rng)
        return [sum(kind.get(name, False) for kind in drawn) / len(drawn) for name in ("scattered", "gapped")]

    scattered, gapped = shares(60)
    assert scattered == 0.0 and 0.3 < gapped < 0.4
    scattered, gapped = shares(120)
    assert abs(scattered - train.LONG_PHASE_MIX[1]) < 0.04 and abs(gapped - train.LONG_PHASE_MIX[0]) < 0.03
    # each phase's cycle: linear warm-up over a 40th of its steps, then cosine down to a tenth
    assert abs(train._cycle(0, 400) - 0.1) < 0.01 and train._cycle(9, 400) > 0.99
    assert abs(train._cycle(400, 400) - 0.1) < 1e-9
    # each phase peaks at its own flag: a frozen first phase leaves the long phase its rate
    frozen = train.parse_args(["--lr", "0", "--steps", "400", "--long-steps", "400", "--long-lr", "1e-4"])
    assert train.learning_rate(399, frozen) == 0.0
    assert train.learning_rate(400 + 9, frozen) == pytest.approx(1e-4 * train._cycle(9, 400))


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
