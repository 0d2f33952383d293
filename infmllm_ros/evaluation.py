"""`infmllm-eval`: accuracy per question family on held-out synthetic episodes, through the session.

Each episode is streamed as a robot would see it: one frame per second, the questions asked at
their times in between, answers kept in the cache (multi-round). Exact match after lower-casing
and trimming. Seeds below 90,000 were never used for training (see tiny_model/train.py).

Beside accuracy it records, for the memory families, how much of the evidence (the tokens of the
frames showing the object asked about) the cache still holds when the question comes: a measure
of what a policy keeps that does not depend on how well the model reads it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from infmllm_ros.engine.adapters import PROMPT_FILE
from infmllm_ros.engine.loading import ModelLoadError, resolve_model_path
from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.synthetic import (FAMILIES, FEED_RATE_HZ, HEIGHT, WIDTH, generate_episode, generate_questions,
                                   possible_answers, possible_questions)
from infmllm_ros.synthetic.questions import DEFAULT_SPACING_S


def wilson_interval(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion (well behaved near 0 and 1, unlike p +- 2 se)."""
    if total == 0:
        return float("nan"), float("nan")
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


class NotEvaluable(ValueError):
    """The model directory cannot be scored on the synthetic world (one-line reason)."""


def check_evaluable(session: StreamingSession, model_dir: Path) -> None:
    """The synthetic questions only mean something to a model trained on their format and words."""
    if not (model_dir / PROMPT_FILE).is_file():
        raise NotEvaluable(f"{model_dir} has no {PROMPT_FILE}: infmllm-eval scores models trained on the synthetic "
                           "world (infmllm-train-tiny writes it)")
    tokenizer = session.tokenizer
    unknown = tokenizer.unk_token_id
    vocabulary = session.model.get_input_embeddings().num_embeddings
    for text in [*(session.prompt.question.format(question=q) for q in possible_questions()), *possible_answers()]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if (unknown is not None and unknown in ids) or max(ids, default=0) >= vocabulary:
            raise NotEvaluable(f"the tokenizer in {model_dir} does not know the words of {text!r}: not the tokenizer "
                               "the model was trained with on the synthetic world")


def _tally(table: dict[str, list[int]], key: str, hits: int, total: int) -> None:
    counts = table.setdefault(key, [0, 0])
    counts[0] += hits
    counts[1] += total


@dataclass
class EvalResult:
    correct: dict[str, int] = field(default_factory=lambda: {f: 0 for f in FAMILIES})
    total: dict[str, int] = field(default_factory=lambda: {f: 0 for f in FAMILIES})
    mistakes: list[dict] = field(default_factory=list)
    evidence_kept: dict[str, list[float]] = field(default_factory=lambda: {f: [] for f in FAMILIES})
    answers: list[dict] = field(default_factory=list)   # {seed, t, question, total_s, ttft_s}
    #: per question kind (template), [correct, total]: a family can hide a kind at chance behind one
    #: that works (distant "what colour was the triangle?" against "what shape was the purple object?")
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    #: recall only, per family: [answers whose recalled frames include one of the evidence's, answers
    #: with frames recalled]: whether the question found its frames
    recall_hits: dict[str, list[int]] = field(default_factory=dict)
    store_mb: float = 0.0   # recall only: the largest store an episode ended with
    frames: int = 0         # frames streamed, and the tokens they appended (fewer with temporal pruning)
    frame_tokens: int = 0

    def accuracy(self) -> dict[str, float]:
        return {f: self.correct[f] / self.total[f] if self.total[f] else float("nan") for f in FAMILIES}

    def count_kind(self, kind: str, right: int, asked: int) -> None:
        _tally(self.by_kind, kind, right, asked)

    def count_recall(self, family: str, hits: int, recalled: int) -> None:
        _tally(self.recall_hits, family, hits, recalled)

    def tokens_per_frame(self) -> float:
        return self.frame_tokens / self.frames if self.frames else float("nan")

    def ttft_p50_ms(self) -> float:
        """Median time to first token of the answers scored (nan when none)."""
        ttfts = sorted(answer["ttft_s"] for answer in self.answers)
        return 1000 * ttfts[len(ttfts) // 2] if ttfts else float("nan")

    def merge(self, other: "EvalResult") -> None:
        """Add another run's counts and records to this one (episodes scored in other processes)."""
        for f in FAMILIES:
            self.correct[f] += other.correct[f]
            self.total[f] += other.total[f]
            self.evidence_kept[f] += other.evidence_kept[f]
        for kind, (right, asked) in other.by_kind.items():
            self.count_kind(kind, right, asked)
        for family, (hits, recalled) in other.recall_hits.items():
            self.count_recall(family, hits, recalled)
        self.store_mb = max(self.store_mb, other.store_mb)
        self.frames += other.frames
        self.frame_tokens += other.frame_tokens
        self.mistakes += other.mistakes
        self.answers += other.answers

    def mean_evidence_kept(self) -> dict[str, float]:
        """Mean share of the evidence tokens still cached at question time, per memory family."""
        return {f: sum(v) / len(v) if v else float("nan") for f, v in self.evidence_kept.items()}


@dataclass
class _FrameSpans:
    """Stream token indices of each fed frame, to locate a question's evidence in the cache."""

    stamps: list[float] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)

    def within(self, start_s: float, end_s: float) -> list[tuple[int, int]]:
        return [span for stamp, span in zip(self.stamps, self.spans) if start_s <= stamp <= end_s]


def frame_times(duration_s: float) -> list[float]:
    """When the model sees a frame: mid-way through each feed period."""
    return [(k + 0.5) / FEED_RATE_HZ for k in range(int(duration_s * FEED_RATE_HZ))]


def render_episode(seed: int, duration_s: float) -> list:
    """The frames evaluate_episode would render, for callers that stream one episode many times."""
    episode = generate_episode(seed, duration_s)
    return [episode.render(t) for t in frame_times(duration_s)]


def evaluate_episode(session: StreamingSession, seed: int, duration_s: float, result: EvalResult,
                     rendered: list | None = None, spacing_s: float = DEFAULT_SPACING_S,
                     forget_answers: bool = False, wait_until: Callable[[float], None] | None = None) -> None:
    """Stream one episode into `session` (from an empty cache) and score its questions into `result`;
    `forget_answers`: each question and answer leaves the cache once scored (frames only);
    `wait_until`: called with each frame's and question's stream time before it goes in (a pace)."""
    wait_until = wait_until or (lambda t: None)
    episode = generate_episode(seed, duration_s)
    questions = sorted(generate_questions(episode, seed, spacing_s=spacing_s), key=lambda q: q.t)
    session.reset()
    pending = iter(questions)
    question = next(pending, None)
    frames = _FrameSpans()
    for k, t in enumerate(frame_times(duration_s)):
        while question is not None and question.t < t:
            wait_until(question.t)
            ask(session, question, seed, result, frames, forget=forget_answers)
            question = next(pending, None)
        wait_until(t)
        start = session.cache.tokens_seen
        timing = session.add_frame(rendered[k] if rendered is not None else episode.render(t), stamp=t)
        result.frames += 1
        result.frame_tokens += timing.tokens
        frames.stamps.append(t)
        frames.spans.append((start, session.cache.tokens_seen))
    while question is not None:
        wait_until(question.t)
        ask(session, question, seed, result, frames, forget=forget_answers)
        question = next(pending, None)


#: frames kept on each side of a cut stream's evidence span
CUT_PAD_FRAMES = 3


#: where a cut stream's tokens sit: packed one after another, or where the whole stream puts them
CUT_POSITIONS = ("compact", "stream")

#: which other frames a cut stream keeps besides the evidence and the tail: none, every frame
#: before the evidence, or every frame between the evidence and the tail
CUT_KEEPS = ("none", "before", "between")


def evaluate_cut_episode(session: StreamingSession, seed: int, duration_s: float, result: EvalResult,
                         tail_frames: int, spacing_s: float = DEFAULT_SPACING_S, positions: str = "compact",
                         keep: str = "none") -> None:
    """Distant questions only, each asked of a fresh cache fed just its evidence frames (+/- a few)
    and the last `tail_frames` frames before it, in time order. `positions` "compact": packed;
    "stream": each at its position in the whole stream (the frames and questions left out still
    advance positions, a question at its reference answer's length), so distance stays as it was.
    `keep` "before" / "between": also every frame before the evidence / between it and the tail.

    A diagnostic of the model, not of a policy: set beside the whole stream it says whether a
    wrong distant answer comes from reading the evidence, from the minutes streamed between, or
    (compact against stream) from how far back the evidence sits; `keep` tells the frames before
    the evidence from those after it.
    """
    if positions not in CUT_POSITIONS:
        raise ValueError(f"positions must be one of {CUT_POSITIONS}")
    if keep not in CUT_KEEPS:
        raise ValueError(f"keep must be one of {CUT_KEEPS}")
    episode = generate_episode(seed, duration_s)
    times = frame_times(duration_s)
    rendered: dict[float, object] = {}
    pad = CUT_PAD_FRAMES / FEED_RATE_HZ
    questions = sorted(generate_questions(episode, seed, spacing_s=spacing_s), key=lambda q: q.t)
    for question in questions:
        if question.family != "distant":
            continue
        t_enter, t_exit = question.evidence
        shown = {t for t in times if t < question.t and (t_enter - pad <= t <= t_exit + pad
                                                         or t >= question.t - tail_frames / FEED_RATE_HZ
                                                         or (keep == "before" and t < t_enter - pad)
                                                         or (keep == "between" and t > t_exit + pad))}
        session.reset()
        earlier = iter(q for q in questions if q.t < question.t)
        other = next(earlier, None)
        for t in times:
            if t >= question.t:
                break
            while positions == "stream" and other is not None and other.t < t:
                _skip_question(session, other)
                other = next(earlier, None)
            if t in shown:
                if t not in rendered:
                    rendered[t] = episode.render(t)
                session.add_frame(rendered[t], stamp=t)
            elif positions == "stream":
                session.skip_frame(_BLANK_FRAME)
        while positions == "stream" and other is not None:
            _skip_question(session, other)
            other = next(earlier, None)
        ask(session, question, seed, result)


#: what a left-out frame is laid out as: any frame of the world's size takes the same positions
_BLANK_FRAME = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)


def _skip_question(session: StreamingSession, question) -> None:
    """Advance positions past a question left out, at the length its reference answer takes."""
    session.skip_text(session.prompt.question.format(question=question.text) + question.answer)


def ask(session, question, seed, result: EvalResult, frames: _FrameSpans | None = None, forget: bool = False) -> None:
    """Ask `question` and score the answer; `forget`: then drop the question and answer from the
    cache, as if never asked (a diagnostic: a stream of frames only)."""
    if session.frames_seen == 0:
        return
    before = session.cache.tokens_seen
    if frames is not None and question.evidence is not None:
        spans = [span for span in frames.within(*question.evidence) if span[1] > span[0]]   # pruned whole: none
        if spans:
            result.evidence_kept[question.family].append(session.cache.kept_share(spans))
    reply = session.ask(question.text)
    if forget:
        session.cache.forget_newest(session.cache.tokens_seen - before)
    result.answers.append({"seed": seed, "t": question.t, "question": question.text, "total_s": reply.total_s,
                           "ttft_s": reply.ttft_s})
    if reply.recalled_stamps and question.evidence is not None:
        start, end = question.evidence
        result.count_recall(question.family, int(any(start <= t <= end for t in reply.recalled_stamps)), 1)
    answer = reply.text.strip().lower()
    result.total[question.family] += 1
    result.count_kind(question.kind, int(answer == question.answer), 1)
    if answer == question.answer:
        result.correct[question.family] += 1
    else:
        result.mistakes.append({"seed": seed, "t": question.t, "question": question.text,
                                "expected": question.answer, "answer": answer})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--policy", default="full", choices=["full", "streaming", "h2o", "infmllm"])
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--recent", type=int, default=256)
    parser.add_argument("--recall-store-mb", type=float, default=0.0,
                        help="keep evicted frames (MB, host memory) and recall the best for each question")
    parser.add_argument("--recall-frames", type=int, default=4, help="frames recalled per question")
    parser.add_argument("--prune-similarity", type=float, default=0.0,
                        help="temporal pruning: leave out visual tokens this cosine-similar to their patch's last "
                             "appended one (0 = off)")
    parser.add_argument("--prune-unit", default="token", choices=["token", "frame"],
                        help="temporal pruning: leave out repeated patches (token) or wholly repeated frames (frame)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--duration", type=float, default=64.0, help="seconds of camera time per episode")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--spacing", type=float, default=DEFAULT_SPACING_S, help="seconds between questions")
    parser.add_argument("--cut-to-evidence", type=int, default=None, metavar="TAIL",
                        help="diagnostic: distant questions only, each asked of a stream cut to its evidence "
                             "frames and the last TAIL frames")
    parser.add_argument("--cut-positions", default="compact", choices=CUT_POSITIONS,
                        help="with --cut-to-evidence: frames packed (compact) or where the whole stream puts them")
    parser.add_argument("--cut-keep", default="none", choices=CUT_KEEPS,
                        help="with --cut-to-evidence: also keep every frame before the evidence, or every frame "
                             "between it and the tail")
    parser.add_argument("--forget-answers", action="store_true",
                        help="diagnostic (full cache only): each question and its answer leave the cache once "
                             "scored, so the stream holds frames only")
    parser.add_argument("--training-seeds", action="store_true",
                        help="diagnostic: allow seeds from 90,000 up (validation and training episodes), to tell a "
                             "model that did not fit its training streams from one that does not generalise")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--quantization", default="auto", help="none, nf4, int8, cpu-int8 or auto")
    args = parser.parse_args(argv)
    if args.forget_answers and args.policy != "full":
        parser.error("--forget-answers is a diagnostic of the model: use it with --policy full")
    if args.first_seed + args.episodes > 90_000 and not args.training_seeds:
        parser.error("seeds from 90,000 up are validation/training episodes (--training-seeds to score them anyway)")

    try:
        session = StreamingSession(SessionConfig(model_path=args.model_path, cache_policy=args.policy,
                                                 cache_budget=args.budget, recent_window=args.recent,
                                                 device=args.device, dtype=args.dtype,
                                                 quantization=args.quantization,
                                                 recall_store_mb=args.recall_store_mb,
                                                 recall_frames=args.recall_frames,
                                                 prune_similarity=args.prune_similarity,
                                                 prune_unit=args.prune_unit))
        check_evaluable(session, resolve_model_path(args.model_path))
    except (ModelLoadError, NotEvaluable, ValueError) as error:
        print(f"infmllm-eval: {error}", file=sys.stderr)
        return 2
    result = EvalResult()
    for seed in tqdm(range(args.first_seed, args.first_seed + args.episodes), desc="episodes",
                     unit="episode", disable=args.json):
        if args.cut_to_evidence is not None:
            evaluate_cut_episode(session, seed, args.duration, result, args.cut_to_evidence, args.spacing,
                                 positions=args.cut_positions, keep=args.cut_keep)
        else:
            evaluate_episode(session, seed, args.duration, result, spacing_s=args.spacing,
                             forget_answers=args.forget_answers)
    accuracy = result.accuracy()
    ttft_p50_ms = result.ttft_p50_ms()
    store_mb = session.cache.store.megabytes if session.cache.store is not None else None
    if args.json:
        json.dump({"policy": args.policy, "budget": args.budget, "episodes": args.episodes,
                   "first_seed": args.first_seed, "device": args.device,
                   "dtype": args.dtype, "quantization": args.quantization,
                   "duration_s": args.duration, "cut_to_evidence": args.cut_to_evidence,
                   "cut_positions": args.cut_positions, "cut_keep": args.cut_keep, "forget_answers": args.forget_answers, "accuracy": accuracy,
                   "correct": result.correct, "total": result.total, "by_kind": dict(sorted(result.by_kind.items())),
                   "recall_store_mb": args.recall_store_mb, "recall_frames": args.recall_frames,
                   "recall_hits": result.recall_hits, "recall_store_mb_at_end": store_mb, "ttft_p50_ms": ttft_p50_ms,
                   "prune_similarity": args.prune_similarity, "prune_unit": args.prune_unit,
                   "tokens_per_frame": result.tokens_per_frame(),
                   "mistakes": result.mistakes}, sys.stdout, indent=2)
        print()
        return 0
    pruning = f" (prune_similarity {args.prune_similarity:g}, by {args.prune_unit})" if args.prune_similarity else ""
    print(f"\npolicy {args.policy}, budget {args.budget}, {args.episodes} episodes of {args.duration:.0f} s; "
          f"time to first token p50 {ttft_p50_ms:.1f} ms; {result.tokens_per_frame():.1f} tokens appended per "
          f"frame{pruning}\n")
    print("| family | correct | total | accuracy | 95 % interval |\n|---|---|---|---|---|")
    for family in FAMILIES:
        low, high = wilson_interval(result.correct[family], result.total[family])
        print(f"| {family} | {result.correct[family]} | {result.total[family]} | {100 * accuracy[family]:.1f} % "
              f"| {100 * low:.1f}-{100 * high:.1f} % |")
    print("\n| question kind | correct | total | accuracy |\n|---|---|---|---|")
    for kind, (right, asked) in sorted(result.by_kind.items()):
        print(f"| {kind} | {right} | {asked} | {100 * right / asked:.1f} % |")
    if result.recall_hits:
        print("\n| family | answers with frames recalled | evidence among them |\n|---|---|---|")
        for family, (hits, recalled) in sorted(result.recall_hits.items()):
            print(f"| {family} | {recalled} | {hits} ({100 * hits / recalled:.0f} %) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
