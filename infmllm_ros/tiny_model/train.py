"""`infmllm-train-tiny`: train the embedded model on synthetic camera streams (CPU, < 30 min).

Fixed seeds throughout: the world, the tokenizer corpus, weight init, sequence sampling. Training
episodes use seeds from TRAIN_SEED_BASE up; evaluation and the demo bag use seeds below it, so
what the model is measured on was never trained on.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from infmllm_ros.models import embedded_model_path
from infmllm_ros.synthetic import FAMILIES, corpus_text

from .architecture import CONTEXT_FRAMES, build_model, build_processor, save_model_dir, train_tokenizer
from .data import IGNORE, build_sequence, render_episodes

TRAIN_SEED_BASE = 100_000
VALIDATION_SEEDS = list(range(90_000, 90_008))


def teacher_forced_accuracy(model, episodes, tokenizer) -> dict[str, float]:
    """Share of answers whose every token is the argmax, per question family (full sequences)."""
    right = {family: 0 for family in FAMILIES}
    total = {family: 0 for family in FAMILIES}
    model.eval()
    with torch.inference_mode():
        for episode in episodes:
            batch = build_sequence(episode, CONTEXT_FRAMES, tokenizer)
            logits = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"]).logits[0, :-1]
            labels = batch["labels"][0, 1:]
            answer_positions = (labels != IGNORE).nonzero().flatten().tolist()
            correct = (logits.argmax(-1) == labels)
            # group consecutive answer tokens into answers
            groups, current = [], []
            for position in answer_positions:
                if current and position != current[-1] + 1:
                    groups.append(current)
                    current = []
                current.append(position)
            if current:
                groups.append(current)
            token_families = iter(batch["families"])
            for group in groups:
                family = next(token_families)
                for _ in group[1:]:
                    next(token_families)
                total[family] += 1
                right[family] += int(all(correct[p] for p in group))
    model.train()
    return {family: right[family] / max(total[family], 1) for family in FAMILIES}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=embedded_model_path())
    parser.add_argument("--episodes", type=int, default=360, help="distinct training episodes to render")
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--min-frames", type=int, default=8, help="shortest training sequence, in frames")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads for training")
    parser.add_argument("--render-workers", type=int, default=2, help="processes rendering episodes")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    sampler = random.Random(args.seed)
    tokenizer = train_tokenizer(corpus_text(range(200)))
    train = render_episodes([TRAIN_SEED_BASE + i for i in range(args.episodes)], tokenizer, workers=args.render_workers)
    validation = render_episodes(VALIDATION_SEEDS, tokenizer, workers=args.render_workers,
                                 desc="validation episodes")
    render_s = time.perf_counter() - started

    model = build_model(tokenizer).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(args.steps // 40, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, args.steps) / args.steps))))
    history = []
    progress = tqdm(range(args.steps), desc="training", unit="step")
    smoothed = None
    for step in progress:
        episode = train[sampler.randrange(len(train))]
        frames = sampler.randint(args.min_frames, CONTEXT_FRAMES)
        batch = build_sequence(episode, frames, tokenizer)
        if not batch["families"]:
            continue
        loss = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"], labels=batch["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        smoothed = loss.item() if smoothed is None else 0.98 * smoothed + 0.02 * loss.item()
        progress.set_postfix(loss=f"{smoothed:.3f}")
        if (step + 1) % 1000 == 0 or step + 1 == args.steps:
            accuracy = teacher_forced_accuracy(model, validation, tokenizer)
            history.append({"step": step + 1, "loss": smoothed, **accuracy})
            tqdm.write(f"step {step + 1}: loss {smoothed:.3f} " + " ".join(f"{k} {v:.2f}" for k, v in accuracy.items()))

    record = {"train_seconds": round(time.perf_counter() - started, 1), "render_seconds": round(render_s, 1),
              "steps": args.steps, "episodes": args.episodes, "lr": args.lr, "seed": args.seed,
              "train_seed_base": TRAIN_SEED_BASE, "validation": history,
              "command": "infmllm-train-tiny " + " ".join(argv or [])}
    save_model_dir(model.eval(), build_processor(tokenizer), args.out, record)
    print(f"wrote {args.out} after {record['train_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
