"""`infmllm-eval`: one-line refusals for model directories it cannot score, and the interval it reports."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from infmllm_ros.evaluation import wilson_interval
from infmllm_ros.models import embedded_model_path
from infmllm_ros.tiny_model.architecture import train_tokenizer


def evaluate(model_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infmllm_ros.evaluation", "--model-path", str(model_dir),
                           "--episodes", "1", "--duration", "8"], capture_output=True, text=True, timeout=180)


def one_line_refusal(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("infmllm-eval:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for word in words:
        assert word in lines[0]


def test_model_without_prompt_file_is_refused_in_one_line(tmp_path):
    copy = shutil.copytree(embedded_model_path(), tmp_path / "model")
    (copy / "infmllm_prompt.json").unlink()
    one_line_refusal(evaluate(copy), "infmllm_prompt.json")


def test_model_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    copy = shutil.copytree(embedded_model_path(), tmp_path / "model")
    train_tokenizer(["a tokenizer trained on other words entirely"]).save_pretrained(copy)
    one_line_refusal(evaluate(copy), "tokenizer")


def test_missing_model_directory_is_refused_in_one_line(tmp_path):
    one_line_refusal(evaluate(tmp_path / "nowhere"), "not a directory")


def test_wilson_interval_contains_the_rate_and_narrows_with_more_questions():
    low, high = wilson_interval(30, 100)
    assert low < 0.30 < high
    assert wilson_interval(300, 1000)[1] - wilson_interval(300, 1000)[0] < high - low
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == pytest.approx(1.0)
