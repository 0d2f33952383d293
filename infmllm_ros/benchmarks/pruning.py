"""Pruning suite: accuracy against tokens appended per frame, by `prune_unit` and `prune_similarity`.

Two settings a robot builder weighs pruning in: the full cache on 64 s episodes (does leaving out
repeated patches or frames cost answers?) and the node's default cache (infmllm at 1,024 tokens) on
10-minute episodes (do the tokens saved let the same budget reach further back?).
"""

from __future__ import annotations

import multiprocessing

import torch
from tqdm import tqdm

from infmllm_ros.evaluation import EvalResult, evaluate_episode, render_episode

from .measure import make_session, score_episodes
from .quality import FIRST_SEED, RECENT_SHARE, accuracy_columns

OFF = ("token", 0.0)
#: (prune_unit, prune_similarity) pairs; OFF is the reference every row is compared with
VARIANTS = (OFF, ("token", 0.999), ("token", 0.995), ("token", 0.99), ("token", 0.98),
            ("frame", 0.995), ("frame", 0.99), ("frame", 0.98), ("frame", 0.95))


def setting_name(policy: str, budget: int, duration_s: float) -> str:
    return f"full, {duration_s:.0f} s" if policy == "full" else f"{policy} at {budget} tokens, {duration_s:.0f} s"


def run_pruning(model_path, episodes: int, duration_s: float, policy: str, budget: int, variants=VARIANTS,
                spacing_s: float = 3.0, workers: int = 1) -> list[dict]:
    """One row per variant (the first is the reference, OFF): accuracy per family with 95 % intervals and
    tokens appended per frame. Each episode is rendered once and streamed under every variant,
    `workers` episodes at a time."""
    seeds = list(range(FIRST_SEED, FIRST_SEED + episodes))
    jobs = [(model_path, seed, duration_s, policy, budget, variants, spacing_s) for seed in seeds]
    with tqdm(total=episodes, desc=f"pruning {policy} {duration_s:.0f} s", unit="episode") as progress:
        by_seed = score_episodes(_score_episode, jobs, workers, progress)
    results = {variant: EvalResult() for variant in variants}
    for seed in seeds:
        for variant, result in by_seed[seed].items():
            results[variant].merge(result)
    whole = results[variants[0]].tokens_per_frame()
    rows = []
    for (unit, threshold), result in results.items():
        rows.append({"setting": setting_name(policy, budget, duration_s), "prune_unit": unit if threshold else "off",
                     "prune_similarity": threshold, "frames": result.frames,
                     "tokens_per_frame": result.tokens_per_frame(), "kept_pct": 100 * result.tokens_per_frame() / whole,
                     **accuracy_columns(result)})
    return rows


def plot_lines(rows: list[dict]) -> dict[str, list[dict]]:
    """One line per setting and unit, each starting from its setting's unpruned row."""
    lines: dict[str, list[dict]] = {}
    for row in rows:
        if row["prune_unit"] != "off":
            name = f"{row['setting']}, by {row['prune_unit']}"
            if name not in lines:
                lines[name] = [next(r for r in rows if r["setting"] == row["setting"] and r["prune_unit"] == "off")]
            lines[name].append(row)
    return lines


def _score_episode(job) -> tuple[int, dict]:
    model_path, seed, duration_s, policy, budget, variants, spacing_s = job
    if multiprocessing.current_process().name != "MainProcess":
        torch.set_num_threads(1)
    rendered = render_episode(seed, duration_s)
    cells = {}
    for unit, threshold in variants:
        cells[(unit, threshold)] = EvalResult()
        session = make_session(model_path, policy, budget, max(int(RECENT_SHARE * budget), 1) if budget else 0,
                               prune_similarity=threshold, prune_unit=unit)
        evaluate_episode(session, seed, duration_s, cells[(unit, threshold)], rendered, spacing_s)
    return seed, cells
