"""Training sequences from the synthetic world: frames at 1 Hz interleaved with questions.

A sequence is written exactly as the session will write a live stream (architecture.PROMPT):
each frame is "<frame>" plus its visual tokens, each question "<q> ... <a>" followed by the
answer and "</s>". Only answer tokens carry loss. Frames are rendered at camera resolution and
passed through the model's own image processor, so training sees what inference sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from infmllm_ros.synthetic import COUNT_WORDS, FEED_RATE_HZ, TEMPLATES, WIDTH, Question, generate_episode, generate_questions
from infmllm_ros.synthetic.questions import SIDE_MARGIN_PX

from .architecture import CONTEXT_FRAMES, IMAGE_TOKENS, PROMPT, build_processor

IGNORE = -100


@dataclass
class RenderedEpisode:
    seed: int
    frame_times: np.ndarray        # (F,) seconds
    pixels: torch.Tensor           # (F, 3, H, W) float16, already normalised by the processor
    questions: list[Question]


def render_episode(args) -> RenderedEpisode:
    seed, tokenizer, spacing_s = args
    episode = generate_episode(seed, CONTEXT_FRAMES / FEED_RATE_HZ + 1.0)
    phase = np.random.default_rng([seed, 99]).uniform(0.0, 1.0 / FEED_RATE_HZ)
    times = phase + np.arange(CONTEXT_FRAMES) / FEED_RATE_HZ
    processor = build_processor(tokenizer)
    images = [Image.fromarray(episode.render(float(t))) for t in times]
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"].to(torch.float16)
    return RenderedEpisode(seed, times, pixels, generate_questions(episode, seed, spacing_s=spacing_s))


def render_episodes(seeds: list[int], tokenizer, workers: int = 2, desc: str = "rendering episodes",
                    spacing_s: float = 3.0, cache_dir: Path | None = None) -> list[RenderedEpisode]:
    """Render (or load from `cache_dir`, keyed by seed and spacing) every episode."""
    cached = {}
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            path = cache_dir / f"{seed}_{spacing_s:g}.pt"
            if path.exists():
                cached[seed] = torch.load(path, weights_only=False)
    todo = [seed for seed in seeds if seed not in cached]
    with Pool(workers) as pool:
        jobs = pool.imap(render_episode, [(seed, tokenizer, spacing_s) for seed in todo], chunksize=4)
        for episode in tqdm(jobs, total=len(todo), desc=desc, unit="episode"):
            cached[episode.seed] = episode
            if cache_dir is not None:
                torch.save(episode, cache_dir / f"{episode.seed}_{spacing_s:g}.pt")
    return [cached[seed] for seed in seeds]


def frame_questions(episode, t: float) -> list[tuple[str, str]]:
    """Every current-scene question the single frame at t answers unambiguously.

    Used for the first training stage: many answers per frame teach the vision tower to see
    before the language model has to learn to remember.
    """
    visible = episode.visible(t)
    if not all(state.fully_in_view for state in visible) or len(visible) >= len(COUNT_WORDS):
        return []
    probes = [(TEMPLATES["count"], COUNT_WORDS[len(visible)])]
    shapes = [state.shape for state in visible]
    colours = [state.colour for state in visible]
    for state in visible:
        if shapes.count(state.shape) == 1:
            probes.append((TEMPLATES["colour_of_shape"].format(shape=state.shape), state.colour))
        if colours.count(state.colour) == 1:
            probes.append((TEMPLATES["shape_of_colour"].format(colour=state.colour), state.shape))
        if abs(state.x - WIDTH / 2) >= SIDE_MARGIN_PX:
            side = "left" if state.x < WIDTH / 2 else "right"
            probes.append((TEMPLATES["side"].format(colour=state.colour, shape=state.shape), side))
    return probes


class SequenceWriter:
    """Token ids and loss labels of one training stream, written in architecture.PROMPT's format."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.frame_ids = [tokenizer.convert_tokens_to_ids("<frame>")] + [
            tokenizer.convert_tokens_to_ids("<image>")] * IMAGE_TOKENS
        self.ids: list[int] = []
        self.labels: list[int] = []
        self.families: list[str] = []

    def frame(self) -> None:
        self.ids += self.frame_ids
        self.labels += [IGNORE] * len(self.frame_ids)

    def question(self, text: str, answer: str, family: str) -> None:
        """The question carries no loss; its answer and the closing "</s>" do."""
        prompt = self.tokenizer(PROMPT["question"].format(question=text), add_special_tokens=False)["input_ids"]
        target = self.tokenizer(f"{answer}</s>", add_special_tokens=False)["input_ids"]
        self.ids += prompt + target
        self.labels += [IGNORE] * len(prompt) + target
        self.families += [family] * len(target)

    def batch(self, pixels: torch.Tensor) -> dict:
        return {"input_ids": torch.tensor([self.ids]), "labels": torch.tensor([self.labels]),
                "pixel_values": pixels.float(), "families": self.families}


def build_probe_sequence(episode: RenderedEpisode, frame_indices: list[int], tokenizer, rng) -> dict:
    """A few frames, each followed by all its current-scene questions (stage 1)."""
    world = generate_episode(episode.seed, CONTEXT_FRAMES / FEED_RATE_HZ + 1.0)
    writer = SequenceWriter(tokenizer)
    for index in frame_indices:
        writer.frame()
        probes = frame_questions(world, float(episode.frame_times[index]))
        rng.shuffle(probes)
        for text, answer in probes:
            writer.question(text, answer, "current")
    return writer.batch(episode.pixels[frame_indices])


def build_sequence(episode: RenderedEpisode, frames: int, tokenizer) -> dict[str, torch.Tensor]:
    """input_ids, labels, pixel_values and families for the first `frames` frames of an episode."""
    last_time = episode.frame_times[frames - 1] + 1.0 / FEED_RATE_HZ
    events = [(float(t), 0, index) for index, t in enumerate(episode.frame_times[:frames])]
    events += [(q.t, 1, index) for index, q in enumerate(episode.questions) if q.t < last_time]
    writer = SequenceWriter(tokenizer)
    for _, kind, index in sorted(events):
        if kind == 0:
            writer.frame()
        else:
            question = episode.questions[index]
            writer.question(question.text, question.answer, question.family)
    return writer.batch(episode.pixels[:frames])
