"""A text-only stream as long as wanted: the synthetic world's question-answer exchanges.

For the text-stream benchmark (perplexity over a million tokens). The embedded model's language
model only knows this package's prompt format and 43 words, so its "narration" is what it was
trained to read: "<q> question <a> answer</s>" exchanges, taken in time order from real episodes.
A pool of episodes is generated once and walked through again in a new order per pass, so the
stream is unbounded while no exchange repeats within a pool's length of tokens.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from .questions import generate_questions
from .world import generate_episode

QUESTION_FORMAT = "<q> {question} <a>"


def episode_exchanges(seed: int, duration_s: float, question_format: str = QUESTION_FORMAT) -> list[str]:
    """One episode's exchanges, in the order they were asked."""
    questions = generate_questions(generate_episode(seed, duration_s), seed)
    return [f"{question_format.format(question=q.text)} {q.answer}</s>" for q in questions]


def narration_ids(tokenizer, seed: int = 0, pool_episodes: int = 24, duration_s: float = 300.0,
                  question_format: str = QUESTION_FORMAT) -> Iterator[int]:
    """Token ids of an endless narration (stop reading when you have enough)."""
    rng = np.random.default_rng(seed)
    pool = []
    for k in range(pool_episodes):
        text = " ".join(episode_exchanges(80_000 + seed * pool_episodes + k, duration_s, question_format))
        pool.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    while True:
        for index in rng.permutation(len(pool)):
            yield from pool[index]
