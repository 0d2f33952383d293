"""The shipped model: loads offline through the session by default and really sees the scene."""

from __future__ import annotations

import json
import subprocess
import sys

from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.models import embedded_model_path
from infmllm_ros.synthetic import FEED_RATE_HZ, generate_episode, generate_questions

FIXED_SEEDS = range(1, 9)        # held out: training uses seeds >= 100,000
# Chance on this question mix is about 0.3 (colour 1/6, shape 1/4, count 1/4, side 1/2). The shipped
# model gets 19/32 here (59 %, greedy decoding is deterministic) and 66.3 % on infmllm-eval's 190
# current-scene questions: far from the 90 % target (README). The floor asserts it really sees,
# clearly above chance, and catches a broken loading or prompt path, which falls to chance.
MIN_ACCURACY = 0.40


def current_scene_questions(seed: int, limit: int = 4, horizon_s: float = 24.0):
    episode = generate_episode(seed, horizon_s)
    questions = [q for q in generate_questions(episode, seed) if q.family == "current" and q.t < horizon_s]
    return episode, questions[:limit]


def test_embedded_model_directory_is_complete():
    directory = embedded_model_path()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "processor_config.json",
                 "infmllm_prompt.json", "training.json"):
        assert (directory / name).is_file(), f"{name} missing from the shipped model"
    assert (directory / "model.safetensors").stat().st_size < 20 * 2**20


def accuracy_on_fixed_questions(session: StreamingSession, seeds=FIXED_SEEDS) -> tuple[int, int, list]:
    """(right, asked, mistakes) on the fixed current-scene questions, frames streamed at 1 Hz."""
    right, asked, wrong = 0, 0, []
    for seed in seeds:
        episode, questions = current_scene_questions(seed)
        session.reset()
        t = 0.5 / FEED_RATE_HZ
        for question in questions:
            while t < question.t:
                session.add_frame(episode.render(t), stamp=t)
                t += 1.0 / FEED_RATE_HZ
            answer = session.ask(question.text).text
            asked += 1
            right += answer == question.answer
            if answer != question.answer:
                wrong.append((seed, question.text, question.answer, answer))
    return right, asked, wrong


def test_embedded_model_answers_current_scene_questions():
    session = StreamingSession(SessionConfig(cache_policy="full"))   # model_path None: the embedded default
    right, asked, wrong = accuracy_on_fixed_questions(session)
    assert asked >= 24
    print(f"embedded model, current scene: {right}/{asked} correct; wrong: {wrong}")
    assert right / asked >= MIN_ACCURACY, wrong


def test_embedded_model_loads_with_hub_offline(tmp_path):
    """A fresh process with HF_HUB_OFFLINE=1 loads the default model and answers."""
    probe = ("import numpy as np; from infmllm_ros.engine.session import StreamingSession; "
             "s = StreamingSession(); s.add_frame(np.full((480, 640, 3), 128, np.uint8)); "
             "print(s.ask('how many objects are in view?').text)")
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "zero"


def test_training_record_is_shipped():
    """How the shipped weights were made travels with them (timings are reported, not asserted)."""
    record = json.loads((embedded_model_path() / "training.json").read_text())
    assert record["train_seed_base"] >= 90_000 and record["steps"] > 0
    assert record["validation"], "validation accuracy was tracked during training"
