"""`infmllm-eval`: one-line refusals for model directories it cannot score, and the interval it reports."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from infmllm_ros.evaluation import wilson_interval
from infmllm_ros.models import embedded_model_path
from infmllm_ros.tiny_model.architecture import train_tokenizer


def evaluate(model_dir, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infmllm_ros.evaluation", "--model-path", str(model_dir),
                           "--episodes", "1", "--duration", "8", *options], capture_output=True, text=True,
                          timeout=180)


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_device_the_machine_lacks_is_refused_in_one_line():
    one_line_refusal(evaluate(embedded_model_path(), "--device", "cuda", "--quantization", "nf4"), "CUDA")


def test_wilson_interval_contains_the_rate_and_narrows_with_more_questions():
    low, high = wilson_interval(30, 100)
    assert low < 0.30 < high
    assert wilson_interval(300, 1000)[1] - wilson_interval(300, 1000)[0] < high - low
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == pytest.approx(1.0)


def recording_session(config):
    """The real session, with the stamps of the frames fed since its last reset written down at
    each question: (question, stamps, frames_seen) in `session.asked`."""
    from infmllm_ros.engine.session import StreamingSession

    class Recording(StreamingSession):
        def reset(self):
            super().reset()
            self.fed = []

        def add_frame(self, image, stamp=None):
            self.fed.append(stamp)
            return super().add_frame(image, stamp=stamp)

        def ask(self, question, *args, **kwargs):
            self.asked.append((question, list(self.fed), self.frames_seen))
            return super().ask(question, *args, **kwargs)

    session = Recording(config)
    session.asked = []
    return session


def test_cut_streams_feed_only_the_evidence_and_the_tail():
    """--cut-to-evidence: each distant question gets a fresh cache holding its evidence frames
    (+/- CUT_PAD_FRAMES) and the last TAIL frames before it, and nothing from between."""
    from infmllm_ros.engine.session import SessionConfig
    from infmllm_ros.evaluation import CUT_PAD_FRAMES, EvalResult, evaluate_cut_episode
    from infmllm_ros.synthetic import generate_episode, generate_questions

    seed, duration, tail = 2001, 140.0, 8   # three distant questions
    session = recording_session(SessionConfig(cache_policy="full"))
    asked = session.asked
    result = EvalResult()
    evaluate_cut_episode(session, seed, duration, result, tail_frames=tail)
    distant = sorted((q for q in generate_questions(generate_episode(seed, duration), seed) if q.family == "distant"),
                     key=lambda q: q.t)
    assert len(asked) == len(distant) == result.total["distant"] > 0
    assert sum(result.total.values()) == result.total["distant"]
    # per kind, the same questions regrouped by template
    kinds = {q.kind for q in distant}
    assert set(result.by_kind) == kinds and sum(asked for _, asked in result.by_kind.values()) == len(distant)
    assert sum(right for right, _ in result.by_kind.values()) == result.correct["distant"]
    for question, (text, fed, frames_seen) in zip(distant, asked):
        assert text == question.text and frames_seen == len(fed)
        t_enter, t_exit = question.evidence
        tail_frames = [t for t in fed if t >= question.t - tail]
        evidence = [t for t in fed if t_enter - CUT_PAD_FRAMES <= t <= t_exit + CUT_PAD_FRAMES]
        assert len(tail_frames) == tail and all(t < question.t for t in fed)
        assert sorted(set(tail_frames + evidence)) == fed, "a frame from the minutes between was fed"
        assert any(t_enter <= t < t_exit for t in fed), "the evidence itself must be shown"


@pytest.mark.parametrize("keep", ["before", "between"])
def test_cut_streams_can_keep_the_frames_before_or_after_the_evidence(keep):
    """--cut-keep: besides the evidence and the tail, every frame before the evidence (before) or
    every frame from the evidence to the tail (between), and no other."""
    from infmllm_ros.engine.session import SessionConfig
    from infmllm_ros.evaluation import CUT_PAD_FRAMES, EvalResult, evaluate_cut_episode, frame_times
    from infmllm_ros.synthetic import generate_episode, generate_questions

    seed, duration, tail = 2003, 140.0, 4   # evidence from 3.9 s: one frame before it
    session = recording_session(SessionConfig(cache_policy="full"))
    evaluate_cut_episode(session, seed, duration, EvalResult(), tail_frames=tail, positions="stream", keep=keep)
    distant = sorted((q for q in generate_questions(generate_episode(seed, duration), seed) if q.family == "distant"),
                     key=lambda q: q.t)
    assert len(session.asked) == len(distant) > 0
    between_cut_and_whole = 0
    for question, (_, fed, _) in zip(distant, session.asked):
        t_enter, t_exit = question.evidence
        before = [t for t in frame_times(duration) if t < question.t]
        evidence_or_tail = [t for t in before if t_enter - CUT_PAD_FRAMES <= t <= t_exit + CUT_PAD_FRAMES
                            or t >= question.t - tail]
        kept = [t for t in before if (t < t_enter - CUT_PAD_FRAMES if keep == "before" else t > t_exit + CUT_PAD_FRAMES)]
        assert fed == sorted(set(evidence_or_tail + kept))
        between_cut_and_whole += len(evidence_or_tail) < len(fed) < len(before)
    assert between_cut_and_whole, "some question keeps more than the cut and less than the whole stream"


def test_cut_streams_can_keep_the_whole_streams_positions():
    """--cut-positions stream: each frame fed sits at the position the whole stream gives it (the
    frames and questions left out still advance positions), so only the minutes between are gone."""
    from infmllm_ros.engine.session import SessionConfig, StreamingSession
    from infmllm_ros.evaluation import EvalResult, evaluate_cut_episode, frame_times
    from infmllm_ros.synthetic import generate_episode, generate_questions

    class Recording(StreamingSession):
        def reset(self):
            super().reset()
            self.fed = {}

        def add_frame(self, image, stamp=None):
            self.fed[stamp] = self.cache.next_position
            return super().add_frame(image, stamp=stamp)

        def ask(self, question, *args, **kwargs):
            asked.append((dict(self.fed), self.cache.next_position))
            return super().ask(question, *args, **kwargs)

    asked = []
    seed, duration = 2001, 140.0
    session = Recording(SessionConfig(cache_policy="full"))
    evaluate_cut_episode(session, seed, duration, EvalResult(), tail_frames=4, positions="stream")
    # the whole stream, every question followed by its reference answer
    episode = generate_episode(seed, duration)
    questions = sorted(generate_questions(episode, seed), key=lambda q: q.t)
    whole, at_question = {}, {}
    session.reset()
    pending = iter(questions)
    question = next(pending, None)
    for t in frame_times(duration):
        while question is not None and question.t < t:
            at_question[question.t] = session.cache.next_position
            session.add_text(session.prompt.question.format(question=question.text) + question.answer)
            question = next(pending, None)
        whole[t] = session.cache.next_position
        session.add_frame(episode.render(t), stamp=t)
    distant = [q for q in questions if q.family == "distant"]
    assert len(asked) == len(distant) > 0
    for question, (fed, position) in zip(distant, asked):
        assert 0 < len(fed) < len([t for t in whole if t < question.t]), "a cut stream leaves frames out"
        assert all(fed_position == whole[t] for t, fed_position in fed.items())
        assert position == at_question[question.t]


def test_forgotten_answers_leave_frames_only():
    """--forget-answers: every question is still asked and scored, and the cache ends holding the
    frames alone, at the positions a stream of frames alone gives them."""
    from infmllm_ros.engine.session import SessionConfig, StreamingSession
    from infmllm_ros.evaluation import EvalResult, evaluate_episode

    session = StreamingSession(SessionConfig(cache_policy="full"))
    result = EvalResult()
    evaluate_episode(session, 3, 20.0, result, forget_answers=True)
    assert sum(result.total.values()) > 0
    assert session.cache.length == session.cache.tokens_seen == result.frame_tokens == 20 * session.frame_tokens
    assert session.cache.next_position == result.frame_tokens


def test_a_pace_sees_every_frame_and_question_in_stream_order_before_it_goes_in():
    """wait_until (the node suite's real-time engine reference) is called once per frame and per
    question, with its stream time, in order, before the session takes it."""
    from infmllm_ros.engine.session import SessionConfig
    from infmllm_ros.evaluation import EvalResult, evaluate_episode

    session = recording_session(SessionConfig(cache_policy="full"))
    waits = []   # (stream time, frames fed, questions asked) at each wait
    result = EvalResult()
    evaluate_episode(session, 3, 20.0, result,
                     wait_until=lambda t: waits.append((t, len(session.fed), len(session.asked))))
    times = [t for t, _, _ in waits]
    assert times == sorted(times) and len(waits) == result.frames + sum(result.total.values()) > result.frames
    ends = [(fed, asked) for _, fed, asked in waits[1:]] + [(len(session.fed), len(session.asked))]
    for (t, fed, asked), (next_fed, next_asked) in zip(waits, ends):
        # between a wait and the next, what it paced and nothing else: one frame at that very time, or one question
        assert (next_fed - fed, next_asked - asked) in ((1, 0), (0, 1))
        assert next_fed == fed or session.fed[fed] == t


def test_training_seeds_are_refused_unless_asked_for(capsys):
    """Evaluation seeds stay disjoint from training ones; scoring the training episodes is a named diagnostic."""
    from infmllm_ros.evaluation import main
    with pytest.raises(SystemExit) as refused:
        main(["--first-seed", "100000", "--episodes", "1"])
    assert refused.value.code == 2 and "--training-seeds" in capsys.readouterr().err
    assert main(["--first-seed", "100000", "--episodes", "1", "--duration", "8", "--training-seeds", "--json"]) == 0
    assert '"correct"' in capsys.readouterr().out
