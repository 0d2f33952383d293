"""Synthetic robot-camera world: deterministic scenes, frames, questions and a demo bag.

Used to train and evaluate the tiny multimodal model and to ship a demo rosbag, with
ground truth that comes from the world state rather than from pixels.
"""

from .questions import (
    COUNT_WORDS,
    FAMILIES,
    FEED_RATE_HZ,
    SIDES,
    TEMPLATES,
    Question,
    corpus_text,
    generate_questions,
    possible_answers,
    possible_questions,
)
from .render import COLOURS, HEIGHT, SHAPES, WIDTH, render_frame
from .world import Episode, ObjectState, WorldObject, generate_episode

__all__ = [
    "COLOURS",
    "COUNT_WORDS",
    "FAMILIES",
    "FEED_RATE_HZ",
    "HEIGHT",
    "SHAPES",
    "SIDES",
    "TEMPLATES",
    "WIDTH",
    "Episode",
    "ObjectState",
    "Question",
    "WorldObject",
    "corpus_text",
    "generate_episode",
    "generate_questions",
    "possible_answers",
    "possible_questions",
    "render_frame",
]
