"""Tests of the synthetic world: determinism, pixel-checked ground truth, and the demo bag."""

from __future__ import annotations

import json
from collections import Counter

import cv2
import numpy as np
import pytest
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from infmllm_ros.synthetic import (
    COLOURS,
    FAMILIES,
    HEIGHT,
    TEMPLATES,
    WIDTH,
    corpus_text,
    generate_episode,
    generate_questions,
    possible_answers,
    possible_questions,
)
from infmllm_ros.synthetic import demo_bag
from infmllm_ros.synthetic.questions import (DISTANT_GONE_S, DISTANT_WITHIN_S, LONG_GONE_S, LONG_WITHIN_S,
                                             RECENT_AFTER_S)

SEEDS = (0, 1, 2)
DURATION_S = 150.0


@pytest.fixture(scope="module")
def episodes():
    return {seed: generate_episode(seed, DURATION_S) for seed in SEEDS}


@pytest.fixture(scope="module")
def questions(episodes):
    return {seed: generate_questions(ep, seed) for seed, ep in episodes.items()}


# --- determinism -------------------------------------------------------------------------


def test_same_seed_gives_identical_episode_frames_and_questions(episodes, questions):
    again = generate_episode(1, DURATION_S)
    assert again == episodes[1]
    for t in (0.0, 12.3, 77.7):
        assert np.array_equal(again.render(t), episodes[1].render(t))
    assert generate_questions(again, 1) == questions[1]


def test_different_seed_gives_different_world(episodes, questions):
    assert episodes[0].objects != episodes[1].objects
    assert not np.array_equal(episodes[0].render(20.0), episodes[1].render(20.0))
    assert [q.text for q in questions[0]] != [q.text for q in questions[1]]


def test_a_longer_episode_extends_a_shorter_one(episodes, questions):
    short = generate_episode(1, 40.0)
    assert short.objects == episodes[1].objects[:len(short.objects)]
    assert all(o.t_enter >= 40.0 for o in episodes[1].objects[len(short.objects):])
    early = [q for q in generate_questions(short, 1) if q.t < 36.0]
    assert early == questions[1][:len(early)]


def test_frame_format_and_frames_iterator(episodes):
    ep = episodes[0]
    frame = ep.render(5.0)
    assert frame.shape == (HEIGHT, WIDTH, 3) and frame.dtype == np.uint8
    times = [t for t, _ in ep.frames(10.0, start=2.0, end=3.0)]
    assert times == pytest.approx([2.0 + k / 10 for k in range(10)])


def test_noise_and_shake_vary_over_time_but_the_scene_is_stable(episodes):
    ep = episodes[0]
    a, b = ep.render(50.0).astype(int), ep.render(50.1).astype(int)
    assert 0 < np.abs(a - b).mean() < 12  # sensor noise, small shake, not a new scene


# --- ground truth against pixels -----------------------------------------------------


def _blobs(rgb):
    """Saturated connected components: (colour, shape, centroid x) per object, from pixels only."""
    smooth = cv2.medianBlur(rgb, 5).astype(int)
    mask = ((smooth.max(axis=2) - smooth.min(axis=2)) > 60).astype(np.uint8)
    n, labels, stats, centroids = cv2.connectedComponentsWithStats(mask, connectivity=8)
    palette = {name: np.array(rgb_, float) / sum(rgb_) for name, rgb_ in COLOURS.items()}
    blobs = []
    for i in range(1, n):
        if stats[i, cv2.CC_STAT_AREA] < 1000:
            continue
        part = (labels == i).astype(np.uint8)
        core = cv2.erode(part, np.ones((7, 7), np.uint8)).astype(bool)
        mean = rgb[core].astype(float).mean(axis=0)
        colour = min(palette, key=lambda c: np.abs(mean / mean.sum() - palette[c]).sum())
        contours = cv2.findContours(part, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)[0]
        contour = max(contours, key=cv2.contourArea)
        area = float(part.sum())
        solidity = area / cv2.contourArea(cv2.convexHull(contour))
        extent = area / (stats[i, cv2.CC_STAT_WIDTH] * stats[i, cv2.CC_STAT_HEIGHT])
        if solidity < 0.85:
            shape = "cross"
        elif extent > 0.9:
            shape = "square"
        elif extent > 0.65:
            shape = "circle"
        else:
            shape = "triangle"
        blobs.append((colour, shape, centroids[i][0]))
    return blobs


def _answer_from_pixels(rgb, kind, text):
    blobs = _blobs(rgb)
    if kind == "count":
        return ("zero", "one", "two", "three")[len(blobs)]
    if kind == "colour_of_shape":
        shape = text.split()[-1].rstrip("?")
        (colour,) = [c for c, s, _ in blobs if s == shape]
        return colour
    if kind == "shape_of_colour":
        colour = text.split()[-2]
        (shape,) = [s for c, s, _ in blobs if c == colour]
        return shape
    assert kind == "side"
    colour, shape = text.split()[2:4]
    (x,) = [x for c, s, x in blobs if (c, s) == (colour, shape)]
    return "left" if x < WIDTH / 2 else "right"


def test_current_answers_match_the_rendered_pixels(episodes, questions):
    checked = Counter()
    for seed, ep in episodes.items():
        for q in questions[seed]:
            if q.family == "current":
                assert _answer_from_pixels(ep.render(q.t), q.kind, q.text) == q.answer, q
                checked[q.kind] += 1
    assert set(checked) == {"count", "colour_of_shape", "shape_of_colour", "side"}


def test_single_object_colour_and_side_from_pixels(episodes):
    ep = episodes[2]
    for t in np.arange(1.0, DURATION_S, 0.5):
        states = ep.visible(t)
        if len(states) == 1 and states[0].fully_in_view and abs(states[0].x - WIDTH / 2) > 60:
            break
    else:
        pytest.fail("no time with exactly one object fully in view")
    ((colour, shape, x),) = _blobs(ep.render(t))
    assert (colour, shape) == (states[0].colour, states[0].shape)
    assert (x < WIDTH / 2) == (states[0].x < WIDTH / 2)


# --- question families -------------------------------------------------------------------


@pytest.fixture(scope="module")
def ten_minutes():
    """One 10-minute episode and its questions: the only length that asks every family."""
    episode = generate_episode(11, 600.0)
    return episode, generate_questions(episode, 11)


def test_every_family_and_kind_is_generated_and_well_formed(questions, ten_minutes):
    every = [q for qs in questions.values() for q in qs] + ten_minutes[1]
    assert {q.family for q in every} == set(FAMILIES)
    assert {q.kind for q in every} == set(TEMPLATES)
    texts, answers = set(possible_questions()), set(possible_answers())
    for qs in questions.values():
        assert [q.t for q in qs] == sorted(q.t for q in qs)
        assert len(qs) >= DURATION_S / 5  # well spread: about one every 3 s
        assert all(b.t - a.t >= 1.5 for a, b in zip(qs, qs[1:]))
    for q in every:
        assert q.text in texts and q.text.endswith("?") and q.text == q.text.lower()
        assert q.answer in answers and 1 <= len(q.answer.split()) <= 2


def test_recent_long_and_distant_answers_follow_the_world_state(episodes, questions, ten_minutes):
    cases = [(ep, q) for seed, ep in episodes.items() for q in questions[seed]]
    cases += [(ten_minutes[0], q) for q in ten_minutes[1]]
    assert sum(q.family == "distant" for _, q in cases) >= 20
    ranges = {"long": (LONG_GONE_S, LONG_WITHIN_S), "distant": (DISTANT_GONE_S, DISTANT_WITHIN_S)}
    for ep, q in cases:
        if q.family == "recent":
            gone = sorted((o for o in ep.objects if o.t_exit <= q.t), key=lambda o: o.t_exit)
            assert f"{gone[-1].colour} {gone[-1].shape}" == q.answer
            assert RECENT_AFTER_S[0] <= q.t - gone[-1].t_exit <= RECENT_AFTER_S[1]
            assert q.evidence == (gone[-1].t_enter, gone[-1].t_exit)
        elif q.family in ranges:
            seen = [o for o in ep.objects if o.t_enter < q.t]
            key = "shape" if q.kind.startswith("colour_of_shape") else "colour"
            asked = q.text.split()[4]  # "what colour was the <shape> ..." or "... the <colour> ..."
            (target,) = [o for o in seen if getattr(o, key) == asked]
            assert getattr(target, "colour" if key == "shape" else "shape") == q.answer
            gone_s, within_s = ranges[q.family]
            assert target.t_exit <= q.t - gone_s and target.t_enter >= q.t - within_s
            assert all(s.id != target.id for s in ep.visible(q.t))
            assert q.evidence == (target.t_enter, target.t_exit)
        else:
            assert q.evidence is None


def test_corpus_covers_every_generated_string(questions):
    corpus = set(corpus_text([0], duration_s=60.0))
    assert set(possible_questions()) | set(possible_answers()) <= corpus
    assert {q.text for q in questions[0]} <= corpus


# --- demo bag ------------------------------------------------------------------------------


def _read_bag(path):
    store = get_typestore(Stores.ROS2_KILTED)
    with Reader(path) as reader:
        return [(c.topic, c.msgtype, ts, store.deserialize_cdr(raw, c.msgtype))
                for c, ts, raw in reader.messages()]


def _payloads(path):
    return [(topic, ts, m.data if isinstance(m.data, str) else m.data.tobytes())
            for topic, _, ts, m in _read_bag(path)]


def test_demo_bag_round_trip(tmp_path):
    out = tmp_path / "bag"
    assert demo_bag.write_demo_bag(out, seed=7, duration_s=5.0, rate_hz=10.0, progress=False)
    sidecar = json.loads((out / "questions.json").read_text())
    messages = _read_bag(out)
    images = [m for m in messages if m[0] == demo_bag.IMAGE_TOPIC]
    queries = [m for m in messages if m[0] == demo_bag.QUERY_TOPIC]
    assert len(images) == 50 and len(sidecar) >= 1 and len(queries) == len(sidecar)
    assert {m[1] for m in images} == {"sensor_msgs/msg/CompressedImage"}
    assert {m[1] for m in queries} == {"std_msgs/msg/String"}
    episode = generate_episode(7, 5.0)
    for k, (_, _, ts, msg) in enumerate(images):
        assert msg.format == "jpeg" and msg.header.frame_id == "camera"
        assert msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == ts
        assert ts == demo_bag.START_NS + round(k / 10 * 1e9)
        rgb = cv2.cvtColor(cv2.imdecode(msg.data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        assert rgb.shape == (480, 640, 3)
        if k % 10 == 0:  # the JPEG is the rendered frame, up to compression loss
            assert np.abs(rgb.astype(int) - episode.render(k / 10)).mean() < 4
    for (_, _, ts, msg), entry in zip(queries, sidecar):
        assert json.loads(msg.data) == {"id": entry["id"], "question": entry["question"]}
        assert ts == demo_bag.START_NS + round(entry["t"] * 1e9)
        assert set(entry) == {"id", "t", "family", "question", "answer"}
    assert [m[2] for m in messages] == sorted(m[2] for m in messages)


def test_demo_bag_is_a_no_op_when_up_to_date_and_deterministic(tmp_path):
    out = tmp_path / "bag"
    assert demo_bag.write_demo_bag(out, seed=3, duration_s=2.0, progress=False)
    assert demo_bag.main(["--out", str(out), "--seed", "3", "--duration", "2"]) == 0
    assert not demo_bag.write_demo_bag(out, seed=3, duration_s=2.0, progress=False)
    with pytest.raises(FileExistsError):
        demo_bag.write_demo_bag(out, seed=4, duration_s=2.0, progress=False)
    assert demo_bag.write_demo_bag(out, seed=3, duration_s=2.0, force=True, progress=False)
    other = tmp_path / "other"
    demo_bag.write_demo_bag(other, seed=3, duration_s=2.0, progress=False)
    assert _payloads(out) == _payloads(other)
    assert (out / "questions.json").read_text() == (other / "questions.json").read_text()
