"""Training sequences from the synthetic world: frames at 1 Hz interleaved with questions.

A sequence is written exactly as the session will write a live stream (architecture.PROMPT):
each frame is "<frame>" plus its visual tokens, each question "<q> ... <a>" followed by the
answer and "</s>". Only answer tokens carry loss. Frames are rendered at camera resolution and
passed through the model's own image processor, so training sees what inference sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import Pool

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from infmllm_ros.synthetic import FEED_RATE_HZ, Question, generate_episode, generate_questions

from .architecture import CONTEXT_FRAMES, IMAGE_TOKENS, build_processor

IGNORE = -100


@dataclass
class RenderedEpisode:
    seed: int
    frame_times: np.ndarray        # (F,) seconds
    pixels: torch.Tensor           # (F, 3, H, W) float16, already normalised by the processor
    questions: list[Question]


def render_episode(args) -> RenderedEpisode:
    seed, tokenizer = args
    episode = generate_episode(seed, CONTEXT_FRAMES / FEED_RATE_HZ + 1.0)
    phase = np.random.default_rng([seed, 99]).uniform(0.0, 1.0 / FEED_RATE_HZ)
    times = phase + np.arange(CONTEXT_FRAMES) / FEED_RATE_HZ
    processor = build_processor(tokenizer)
    images = [Image.fromarray(episode.render(float(t))) for t in times]
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"].to(torch.float16)
    return RenderedEpisode(seed, times, pixels, generate_questions(episode, seed))


def render_episodes(seeds: list[int], tokenizer, workers: int = 2, desc: str = "rendering episodes"):
    with Pool(workers) as pool:
        jobs = pool.imap(render_episode, [(seed, tokenizer) for seed in seeds], chunksize=4)
        return list(tqdm(jobs, total=len(seeds), desc=desc, unit="episode"))


def build_sequence(episode: RenderedEpisode, frames: int, tokenizer) -> dict[str, torch.Tensor]:
    """input_ids, labels, pixel_values and families for the first `frames` frames of an episode."""
    frame_ids = [tokenizer.convert_tokens_to_ids("<frame>")] + [tokenizer.convert_tokens_to_ids("<image>")] * IMAGE_TOKENS
    last_time = episode.frame_times[frames - 1] + 1.0 / FEED_RATE_HZ
    events = [(float(t), 0, index) for index, t in enumerate(episode.frame_times[:frames])]
    events += [(q.t, 1, index) for index, q in enumerate(episode.questions) if q.t < last_time]
    ids: list[int] = []
    labels: list[int] = []
    families: list[str] = []
    for _, kind, index in sorted(events):
        if kind == 0:
            ids += frame_ids
            labels += [IGNORE] * len(frame_ids)
            continue
        question = episode.questions[index]
        prompt = tokenizer(f"<q> {question.text} <a>", add_special_tokens=False)["input_ids"]
        answer = tokenizer(f"{question.answer}</s>", add_special_tokens=False)["input_ids"]
        ids += prompt + answer
        labels += [IGNORE] * len(prompt) + answer
        families += [question.family] * len(answer)
    return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]),
            "pixel_values": episode.pixels[:frames].float(), "families": families}
