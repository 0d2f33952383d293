"""`infmllm-eval`: accuracy per question family on held-out synthetic episodes, through the session.

Each episode is streamed as a robot would see it: one frame per second, the questions asked at
their times in between, answers kept in the cache (multi-round). Exact match after lower-casing
and trimming. Seeds below 90,000 were never used for training (see tiny_model/train.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.synthetic import FAMILIES, FEED_RATE_HZ, generate_episode, generate_questions


@dataclass
class EvalResult:
    correct: dict[str, int] = field(default_factory=lambda: {f: 0 for f in FAMILIES})
    total: dict[str, int] = field(default_factory=lambda: {f: 0 for f in FAMILIES})
    mistakes: list[dict] = field(default_factory=list)

    def accuracy(self) -> dict[str, float]:
        return {f: self.correct[f] / self.total[f] if self.total[f] else float("nan") for f in FAMILIES}


def evaluate_episode(session: StreamingSession, seed: int, duration_s: float, result: EvalResult) -> None:
    episode = generate_episode(seed, duration_s)
    questions = sorted(generate_questions(episode, seed), key=lambda q: q.t)
    session.reset()
    frame_times = [(k + 0.5) / FEED_RATE_HZ for k in range(int(duration_s * FEED_RATE_HZ))]
    pending = iter(questions)
    question = next(pending, None)
    for t in frame_times:
        while question is not None and question.t < t:
            ask(session, question, seed, result)
            question = next(pending, None)
        session.add_frame(episode.render(t), stamp=t)
    while question is not None:
        ask(session, question, seed, result)
        question = next(pending, None)


def ask(session, question, seed, result: EvalResult) -> None:
    if session.frames_seen == 0:
        return
    answer = session.ask(question.text).text.strip().lower()
    result.total[question.family] += 1
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
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--duration", type=float, default=64.0, help="seconds of camera time per episode")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    if args.first_seed + args.episodes > 90_000:
        parser.error("seeds from 90,000 up are validation/training episodes")

    session = StreamingSession(SessionConfig(model_path=args.model_path, cache_policy=args.policy,
                                             cache_budget=args.budget, recent_window=args.recent))
    result = EvalResult()
    for seed in tqdm(range(args.first_seed, args.first_seed + args.episodes), desc="episodes",
                     unit="episode", disable=args.json):
        evaluate_episode(session, seed, args.duration, result)
    accuracy = result.accuracy()
    if args.json:
        json.dump({"policy": args.policy, "budget": args.budget, "episodes": args.episodes,
                   "duration_s": args.duration, "accuracy": accuracy, "correct": result.correct,
                   "total": result.total, "mistakes": result.mistakes[:50]}, sys.stdout, indent=2)
        print()
        return 0
    print(f"\npolicy {args.policy}, budget {args.budget}, {args.episodes} episodes of {args.duration:.0f} s\n")
    print("| family | correct | total | accuracy |\n|---|---|---|---|")
    for family in FAMILIES:
        print(f"| {family} | {result.correct[family]} | {result.total[family]} | {100 * accuracy[family]:.1f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
