"""`infmllm-train-tiny`: train the embedded model on synthetic camera streams (CPU, < 30 min).

Stages: 0) the vision tower alone, directly supervised on frames (vision_pretraining.py);
1) short sequences of frames, each followed by all its current-scene questions (seeing);
2) whole 1 Hz streams with questions at their times, growing to the full 64-frame context
(remembering: recent and long-range questions). Only answer tokens carry loss.

Fixed seeds throughout: the world, the tokenizer corpus, weight init, sequence sampling. Training
episodes use seeds from TRAIN_SEED_BASE up; evaluation and the demo bag use seeds below it, so
what the model is measured on was never trained on.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from infmllm_ros.models import embedded_model_path
from infmllm_ros.synthetic import FAMILIES, corpus_text

from .architecture import CONTEXT_FRAMES, build_model, build_processor, save_model_dir, train_tokenizer
from .data import IGNORE, build_probe_sequence, build_sequence, render_episodes
from .vision_pretraining import pretrain_vision_tower

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


def train_step(model, optimizer, schedule, batch, smoothed: float | None) -> float:
    loss = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"], labels=batch["labels"]).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    schedule.step()
    return loss.item() if smoothed is None else 0.98 * smoothed + 0.02 * loss.item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=embedded_model_path())
    parser.add_argument("--episodes", type=int, default=300, help="distinct training episodes to render")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--min-frames", type=int, default=2, help="shortest training sequence, in frames")
    parser.add_argument("--curriculum", type=float, default=0.4,
                        help="share of steps (after stage 1) over which streams grow to the full context")
    parser.add_argument("--spacing", type=float, default=1.5, help="seconds between training questions")
    parser.add_argument("--vision-steps", type=int, default=3000, help="stage 0: direct vision pretraining steps")
    parser.add_argument("--vision-lr-scale", type=float, default=0.1,
                        help="learning-rate factor for the pretrained vision tower in later stages")
    parser.add_argument("--probe-frames", type=int, default=12, help="frames per stage-1 sequence")
    parser.add_argument("--seeing-steps", type=float, default=0.25,
                        help="share of steps in stage 1: 1-3 frames, each with all its current-scene questions")
    parser.add_argument("--cache-dir", type=Path, default=None, help="keep rendered episodes here for reruns")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads for training")
    parser.add_argument("--render-workers", type=int, default=2, help="processes rendering episodes")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    sampler = random.Random(args.seed)
    tokenizer = train_tokenizer(corpus_text(range(200)))
    train = render_episodes([TRAIN_SEED_BASE + i for i in range(args.episodes)], tokenizer,
                            workers=args.render_workers, spacing_s=args.spacing, cache_dir=args.cache_dir)
    validation = render_episodes(VALIDATION_SEEDS, tokenizer, workers=args.render_workers,
                                 desc="validation episodes", cache_dir=args.cache_dir)
    render_s = time.perf_counter() - started

    model = build_model(tokenizer).train()
    vision_accuracy = pretrain_vision_tower(model.model.vision_tower, train, steps=args.vision_steps, seed=args.seed)
    tqdm.write("vision pretraining: " + " ".join(f"{k} {v:.2f}" for k, v in vision_accuracy.items()))
    vision = list(model.model.vision_tower.parameters())
    vision_ids = {id(p) for p in vision}
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in model.parameters() if id(p) not in vision_ids]},
         {"params": vision, "lr": args.lr * args.vision_lr_scale}],
        lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(args.steps // 40, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, args.steps) / args.steps))))
    history = []
    progress = tqdm(range(args.steps), desc="training", unit="step")
    smoothed = None
    seeing = int(args.seeing_steps * args.steps)
    ramp = max(int(args.curriculum * args.steps), 1)
    for step in progress:
        episode = train[sampler.randrange(len(train))]
        if step < seeing:
            picks = sorted(sampler.sample(range(CONTEXT_FRAMES), sampler.randint(1, args.probe_frames)))
            batch, stage = build_probe_sequence(episode, picks, tokenizer, sampler), "seeing"
        else:
            # Then whole streams, growing from short to the full context: remembering.
            longest = max(args.min_frames + 6, min(CONTEXT_FRAMES, CONTEXT_FRAMES * (step - seeing) // ramp))
            batch, stage = build_sequence(episode, sampler.randint(args.min_frames, longest), tokenizer), "streams"
        if batch["families"]:
            smoothed = train_step(model, optimizer, schedule, batch, smoothed)
            progress.set_postfix(loss=f"{smoothed:.3f}", stage=stage)
        if (step + 1) % 1000 == 0 or step + 1 == args.steps:
            accuracy = teacher_forced_accuracy(model, validation, tokenizer)
            history.append({"step": step + 1, "loss": smoothed, **accuracy})
            tqdm.write(f"step {step + 1}: loss {smoothed:.3f} " + " ".join(f"{k} {v:.2f}" for k, v in accuracy.items()))

    record = {"vision_pretraining": vision_accuracy, "train_seconds": round(time.perf_counter() - started, 1), "render_seconds": round(render_s, 1),
              "steps": args.steps, "episodes": args.episodes, "lr": args.lr, "seed": args.seed,
              "train_seed_base": TRAIN_SEED_BASE, "validation": history,
              "command": "infmllm-train-tiny " + " ".join(sys.argv[1:] if argv is None else argv)}
    save_model_dir(model.eval(), build_processor(tokenizer), args.out, record)
    print(f"wrote {args.out} after {record['train_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
