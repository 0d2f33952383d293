"""The dense per-frame training targets name what the world state says, never a guess."""

from __future__ import annotations

import numpy as np

from infmllm_ros.synthetic import COLOURS, SHAPES, generate_episode
from infmllm_ros.tiny_model.frame_targets import TARGETS_PER_FRAME, frame_words
from infmllm_ros.tiny_model.streams import RenderedStream, frame_objects


def test_targets_follow_the_world_state():
    seed, duration = 130_007, 90.0
    episode = generate_episode(seed, duration)
    times = 0.5 + np.arange(int(duration))
    stream = RenderedStream(seed, times, [frame_objects(episode, float(t)) for t in times], [])
    left_seen = 0
    for index, t in enumerate(times):
        words = frame_words(stream, index, times[:index])
        assert len(words) == TARGETS_PER_FRAME
        if stream.objects[index] is None:
            assert words == [None] * TARGETS_PER_FRAME
            continue
        in_view = [(s.colour, s.shape) for s in episode.visible(float(t))]
        for shape, word in zip(SHAPES, words):
            colours = [c for c, s in in_view if s == shape]
            assert word == ("zero" if not colours else colours[0] if len(colours) == 1 else None)
        if words[-1] is not None:
            gone = [o for o in episode.objects if o.t_exit <= t]
            last = max(gone, key=lambda o: o.t_exit)
            assert words[-2:] == [last.colour, last.shape] and words[-2] in COLOURS
            left_seen += 1
    assert left_seen > 10
    # nothing shown before: no what-left target can be claimed
    assert all(frame_words(stream, i, times[:0])[-2:] == [None, None] for i in range(len(times)))
