"""Training streams: long synthetic episodes rendered once at 1 Hz, with labels for every frame.

A stream is the raw material of many training sequences: windows of it are cut at any start,
length and with position gaps (data.py), so a few dozen long episodes give far more distinct
sequences than the same frames spent on many short ones, and they hold what short episodes
cannot: objects seen minutes before a question. Frames go through the model's own image
processor, so training sees what inference sees; pixels are dropped once the frozen vision tower
has turned them into features (features.py).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from multiprocessing import Pool

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from infmllm_ros.synthetic import COLOURS, FEED_RATE_HZ, SHAPES, Question, generate_episode, generate_questions

from .architecture import build_processor

#: Training questions are denser than the evaluation's one per 3 s: answers are the only signal.
TRAIN_SPACING_S = 1.0
SNAPSHOT_EPISODE_S = 120.0


@dataclass
class RenderedStream:
    seed: int
    frame_times: np.ndarray                 # (F,) seconds
    #: per frame, (colour index, shape index, x, y, radius) of each object, or None when one is
    #: only partly in view (then per-object labels would be ambiguous)
    objects: list[list[tuple[int, int, float, float, float]] | None]
    questions: list[Question]
    pixels: torch.Tensor | None = None      # (F, 3, H, W) float16, normalised; dropped after features
    features: torch.Tensor | None = None    # (F, patches, width) float16: the frozen tower's output


def frame_objects(episode, t: float) -> list[tuple[int, int, float, float, float]] | None:
    """The vision stage's labels of the frame at t: (colour index, shape index, x, y, radius) per
    object, or None while one is only partly in view."""
    visible = episode.visible(t)
    if not all(state.fully_in_view for state in visible):
        return None
    return [(list(COLOURS).index(s.colour), SHAPES.index(s.shape), s.x, s.y, s.radius) for s in visible]


def render_stream(args) -> RenderedStream:
    seed, tokenizer, duration_s = args
    episode = generate_episode(seed, duration_s)
    phase = np.random.default_rng([seed, 99]).uniform(0.0, 1.0 / FEED_RATE_HZ)
    times = phase + np.arange(int(duration_s * FEED_RATE_HZ)) / FEED_RATE_HZ
    processor = build_processor(tokenizer)
    objects, pixels = [], []
    for start in range(0, len(times), 64):
        images = []
        for t in times[start:start + 64]:
            images.append(Image.fromarray(episode.render(float(t))))
            objects.append(frame_objects(episode, float(t)))
        pixels.append(processor.image_processor(images=images, return_tensors="pt")["pixel_values"].half())
    questions = generate_questions(episode, seed, spacing_s=TRAIN_SPACING_S)
    return RenderedStream(seed, times, objects, questions, pixels=torch.cat(pixels))


def render_snapshots(args) -> RenderedStream:
    """A few frames at random times of one short episode: many worlds, few frames each.

    What the vision stage learns from. Consecutive 1 Hz frames of a few long streams show the same
    objects again and again, and a tower trained on them learnt to recall each object's shape
    from its colour, size and place (34 % held-out shape accuracy); frames of many episodes leave it
    nothing to memorise but shape itself.
    """
    seed, tokenizer, count = args
    episode = generate_episode(seed, SNAPSHOT_EPISODE_S)
    rng = np.random.default_rng([seed, 7])
    times = np.sort(rng.uniform(1.0, SNAPSHOT_EPISODE_S - 1.0, count))
    processor = build_processor(tokenizer)
    objects, images = [], []
    for t in times:
        images.append(Image.fromarray(episode.render(float(t))))
        objects.append(frame_objects(episode, float(t)))
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"].half()
    return RenderedStream(seed, times, objects, [], pixels=pixels)


def render_many_snapshots(seeds: list[int], per_episode: int, tokenizer, workers: int = 2) -> list[RenderedStream]:
    with Pool(workers, initializer=_worker_defaults) as pool:
        jobs = pool.imap(render_snapshots, [(seed, tokenizer, per_episode) for seed in seeds], chunksize=8)
        return list(tqdm(jobs, total=len(seeds), desc="rendering vision frames", unit="episode"))


def _worker_defaults() -> None:
    """Workers leave SIGTERM to the default: the trainer's handler is for the main process only."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def render_streams(seeds: list[int], duration_s: float, tokenizer, workers: int = 2,
                   desc: str = "rendering streams") -> list[RenderedStream]:
    with Pool(workers, initializer=_worker_defaults) as pool:
        jobs = pool.imap(render_stream, [(seed, tokenizer, duration_s) for seed in seeds])
        return list(tqdm(jobs, total=len(seeds), desc=desc, unit="stream"))
