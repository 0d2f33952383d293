"""`infmllm-train-tiny` as a background job: checkpoints, resume, atomic output, clear refusals.

The runs are tiny (one short stream, a few steps): what is tested is the job's behaviour, not
the model it makes (the shipped model's accuracy is measured by infmllm-eval, see README).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infmllm_ros.tiny_model.schedule import cycle, learning_rate, plan
from infmllm_ros.tiny_model.train import parse_args

TINY = ["--streams", "1", "--stream-seconds", "70", "--validation-streams", "1", "--vision-steps", "5",
        "--vision-episodes", "4", "--short-streams", "0", "--validation-short-streams", "0",
        "--validate-every", "4", "--threads", "1", "--render-workers", "1", "--long-steps", "0"]


def train(*args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infmllm_ros.tiny_model.train", *TINY, *args],
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def test_a_run_writes_the_model_its_curve_and_a_checkpoint(tmp_path):
    out, work = tmp_path / "model", tmp_path / "work"
    done = train("--out", str(out), "--work-dir", str(work), "--steps", "6", "--long-steps", "2",
                 "--retrieval-weight", "0.5")
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "training.json").read_text())
    assert [row["step"] for row in record["validation"]] == [4, 6, 8]   # every 4, and at the end of each phase
    assert record["long_steps"] == 2
    # the rate each phase ran at: its own cycle, peaking at --lr, then at --long-lr
    args = parse_args([*TINY, "--steps", "6", "--long-steps", "2"])
    for row in record["validation"]:
        assert row["lr"] == pytest.approx(learning_rate(plan(args), row["step"]))
    assert learning_rate(plan(args), 6) == pytest.approx(args.long_lr * cycle(0, 2)) and args.long_lr != args.lr
    assert {"current", "recent", "long", "distant", "loss"} <= set(record["validation"][-1])
    assert record["retrieval_weight"] == 0.5 and "recent_mass" in record["validation"][-1]
    assert '"_attn_implementation"' not in (out / "config.json").read_text()   # the training probe stays in training
    assert (out / "training.png").stat().st_size > 1000
    assert (work / "checkpoint.pt").is_file() and (work / "streams.pt").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model")], "staging directory left behind"
    # a second run over the same work dir refuses to start over silently, then resumes on request
    again = train("--out", str(out), "--work-dir", str(work), "--steps", "8")
    assert again.returncode != 0 and "--resume" in again.stderr
    longer = train("--out", str(out), "--work-dir", str(work), "--steps", "6", "--long-steps", "6", "--resume")
    assert longer.returncode == 0, longer.stderr[-2000:]
    said = longer.stdout + longer.stderr
    assert "resumed from" in said and "at step 8" in said
    assert [row["step"] for row in json.loads((out / "training.json").read_text())["validation"]][-1] == 12


def test_rounds_run_the_drill_and_fine_tune_chain_in_one_command(tmp_path):
    """--rounds: the chain the shipped weights came from (a drill, then a fine-tune, per round) in
    one run: each phase recorded with its rate cycle, and validated at its end."""
    out = tmp_path / "model"
    done = train("--out", str(out), "--work-dir", str(tmp_path / "work"), "--steps", "2", "--rounds", "2",
                 "--drill-steps", "2", "--round-steps", "3", "--retrieval-weight", "0.5",
                 "--retrieval-evidence", "objects")
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "training.json").read_text())
    assert [(p["name"], p["start"], p["steps"]) for p in record["phases"]] == [
        ("first", 0, 2), ("drill 1", 2, 2), ("fine-tune 1", 4, 3), ("drill 2", 7, 2), ("fine-tune 2", 9, 3)]
    assert [row["step"] for row in record["validation"]] == [2, 4, 7, 8, 9, 12]   # every 4 and each phase's end
    args = parse_args([*TINY, "--steps", "2", "--rounds", "2", "--drill-steps", "2", "--round-steps", "3"])
    for row in record["validation"]:
        assert row["lr"] == pytest.approx(learning_rate(plan(args), row["step"]))
    assert record["rounds"] == 2 and record["drill_kinds"] == ["colour_of_shape", "colour_of_shape_earlier"]


def test_warm_start_keeps_every_weight_and_writes_the_attention_factor(tmp_path):
    first, warm = tmp_path / "first", tmp_path / "warm"
    done = train("--out", str(first), "--work-dir", str(tmp_path / "w1"), "--steps", "4", "--attention-factor", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    # one step at learning rate 0: the weights must come out exactly as they went in
    again = train("--init-from", str(first), "--out", str(warm), "--work-dir", str(tmp_path / "w2"), "--steps", "1",
                  "--lr", "0", "--attention-factor", "1.3")
    assert again.returncode == 0, again.stderr[-2000:]
    import torch
    from transformers import LlavaForConditionalGeneration
    a, b = (LlavaForConditionalGeneration.from_pretrained(d) for d in (first, warm))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    assert b.config.text_config.rope_parameters["attention_factor"] == 1.3
    first_record, warm_record = (json.loads((d / "training.json").read_text()) for d in (first, warm))
    assert warm_record["init_from"] == str(first)
    # the chain of commands that made the weights: the first run's, then this one's
    assert warm_record["lineage"] == first_record["commands"] + warm_record["commands"]
    assert len(warm_record["lineage"]) == 2 and f"--init-from {first}" in warm_record["lineage"][1]
    # RoPE frequencies unchanged, cos/sin scaled: every attention logit is 1.3^2 times the plain one
    x = torch.zeros(1, 5, a.config.text_config.hidden_size)
    positions = torch.arange(5)[None]
    cos_a, sin_a = a.model.language_model.rotary_emb(x, positions)
    cos_b, sin_b = b.model.language_model.rotary_emb(x, positions)
    assert torch.allclose(cos_b, 1.3 * cos_a) and torch.allclose(sin_b, 1.3 * sin_a)
    assert torch.equal(a.model.language_model.rotary_emb.inv_freq, b.model.language_model.rotary_emb.inv_freq)


def test_continue_vision_trains_the_inherited_tower_on_and_keeps_it(tmp_path):
    """--init-from --continue-vision: stage 0 runs again from the inherited tower; the saved model has
    that new tower (the one whose features the language model read), the rest warm-started."""
    first, continued = tmp_path / "first", tmp_path / "continued"
    done = train("--out", str(first), "--work-dir", str(tmp_path / "w1"), "--steps", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    again = train("--init-from", str(first), "--continue-vision", "--out", str(continued), "--work-dir",
                  str(tmp_path / "w2"), "--steps", "1", "--lr", "0")
    assert again.returncode == 0, again.stderr[-2000:]
    import torch
    from transformers import LlavaForConditionalGeneration
    a, b = (LlavaForConditionalGeneration.from_pretrained(d) for d in (first, continued))
    tower_a, tower_b = a.model.vision_tower.state_dict(), b.model.vision_tower.state_dict()
    assert any(not torch.equal(tower_a[name], tower_b[name]) for name in tower_a), "the tower trained on"
    streams = torch.load(tmp_path / "w2" / "streams.pt", weights_only=False)
    for name, weight in tower_b.items():   # the features the language model was trained on are this tower's
        assert torch.equal(weight, streams["vision_tower"][name]), name
    rest = [name for name in a.state_dict() if "vision_tower" not in name]
    assert all(torch.equal(a.state_dict()[name], b.state_dict()[name]) for name in rest), "lr 0: the rest as loaded"
    record = json.loads((continued / "training.json").read_text())["vision_pretraining"]
    assert record["continued_from"]["from"] == str(first) and {"patch_shape", "object_shape"} <= set(record["inherited"])
    refused = train("--continue-vision", "--out", str(tmp_path / "x"), "--steps", "1")
    assert refused.returncode != 0 and "--continue-vision" in refused.stderr and "Traceback" not in refused.stderr


def test_side_kinds_are_checked_against_the_question_kinds(capsys):
    assert parse_args(TINY).side_kinds == frozenset()
    assert parse_args([*TINY, "--side-kinds", "colour_of_shape,count"]).side_kinds == {"colour_of_shape", "count"}
    with pytest.raises(SystemExit):
        parse_args([*TINY, "--side-kinds", "colour"])
    assert "unknown kind 'colour'" in capsys.readouterr().err


def test_rope_theta_sets_the_language_models_frequencies():
    """--rope-theta: the base the model is built, trained and saved with (default: 10,000)."""
    import torch

    from infmllm_ros.synthetic import corpus_text
    from infmllm_ros.tiny_model.architecture import build_model, train_tokenizer
    assert parse_args(TINY).rope_theta == 10000.0 and parse_args([*TINY, "--rope-theta", "5e5"]).rope_theta == 5e5
    tokenizer = train_tokenizer(corpus_text(range(5)))
    model = build_model(tokenizer, vision_layers=1, language_layers=1, rope_theta=500000.0)
    head_dim = model.config.text_config.hidden_size // model.config.text_config.num_attention_heads
    expected = 500000.0 ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(model.model.language_model.rotary_emb.inv_freq, expected)
    assert model.config.text_config.rope_parameters["rope_theta"] == 500000.0


def test_init_from_and_a_different_vision_from_refused(tmp_path):
    done = train("--init-from", str(tmp_path / "a"), "--vision-from", str(tmp_path / "b"), "--steps", "1",
                 "--out", str(tmp_path / "m"), timeout=60)
    assert done.returncode != 0 and "--init-from" in done.stderr and "Traceback" not in done.stderr


def test_sigterm_saves_a_checkpoint_and_leaves_the_old_model(tmp_path):
    out, work = tmp_path / "model", tmp_path / "work"
    out.mkdir()
    (out / "config.json").write_text("{}")          # stands for an earlier, finished model
    job = subprocess.Popen([sys.executable, "-m", "infmllm_ros.tiny_model.train", *TINY, "--steps", "100000",
                            "--out", str(out), "--work-dir", str(work)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (work / "streams.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)                                    # some language-model steps
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 130, stderr[-2000:]
    assert "checkpoint saved" in stderr and "--resume" in stderr
    assert (work / "checkpoint.pt").is_file()
    assert json.loads((out / "config.json").read_text()) == {}, "the finished model was touched"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_fails_at_once(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    done = train("--out", str(locked / "model"), "--work-dir", str(tmp_path / "work"), "--steps", "4", timeout=60)
    assert done.returncode != 0
    assert "cannot write the model" in done.stderr and "Traceback" not in done.stderr


def test_out_under_a_file_fails_at_once(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    done = train("--out", str(blocker / "model"), "--work-dir", str(tmp_path / "work"), "--steps", "4", timeout=60)
    assert done.returncode != 0
    assert "cannot write the model" in done.stderr and "Traceback" not in done.stderr
    assert not Path(tmp_path / "work" / "streams.pt").exists(), "nothing was rendered before the check"
