"""Pruning suite: accuracy against tokens appended per frame, at several `prune_similarity` thresholds.

Two settings a robot builder weighs pruning in: the full cache on 64 s episodes (does leaving out
repeated patches cost answers?) and the node's default (infmllm at 1,024 tokens) on 10-minute episodes
(do the tokens saved let the same budget reach further back?).
"""

from __future__ import annotations

import multiprocessing

import torch
from tqdm import tqdm

from infmllm_ros.evaluation import EvalResult, evaluate_episode, render_episode, wilson_interval
from infmllm_ros.synthetic import FAMILIES

from .measure import make_session
from .quality import FIRST_SEED, RECENT_SHARE

THRESHOLDS = (0.0, 0.999, 0.995, 0.99, 0.98)


def setting_name(policy: str, budget: int, duration_s: float) -> str:
    return f"full, {duration_s:.0f} s" if policy == "full" else f"{policy} at {budget} tokens, {duration_s:.0f} s"


def run_pruning(model_path, episodes: int, duration_s: float, policy: str, budget: int, thresholds=THRESHOLDS,
                spacing_s: float = 3.0, workers: int = 1) -> list[dict]:
    """One row per threshold (0 = off): accuracy per family with 95 % intervals, tokens per frame.
    Each episode is rendered once and streamed at every threshold, `workers` episodes at a time."""
    seeds = list(range(FIRST_SEED, FIRST_SEED + episodes))
    jobs = [(model_path, seed, duration_s, policy, budget, thresholds, spacing_s) for seed in seeds]
    by_seed = {}
    with tqdm(total=episodes, desc=f"pruning {policy} {duration_s:.0f} s", unit="episode") as progress:
        if workers > 1:
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                for seed, cells in pool.imap_unordered(_score_episode, jobs):
                    by_seed[seed] = cells
                    progress.update()
        else:
            for job in jobs:
                seed, cells = _score_episode(job)
                by_seed[seed] = cells
                progress.update()
    results = {threshold: EvalResult() for threshold in thresholds}
    for seed in seeds:
        for threshold, result in by_seed[seed].items():
            results[threshold].merge(result)
    whole = results[thresholds[0]].tokens_per_frame()
    rows = []
    for threshold, result in results.items():
        row = {"setting": setting_name(policy, budget, duration_s), "prune_similarity": threshold, "tokens_per_frame": result.tokens_per_frame(),
               "kept_pct": 100 * result.tokens_per_frame() / whole}
        accuracy = result.accuracy()
        for family in FAMILIES:
            low, high = wilson_interval(result.correct[family], result.total[family])
            row.update({f"acc_{family}": 100 * accuracy[family], f"lo_{family}": 100 * low,
                        f"hi_{family}": 100 * high, f"n_{family}": result.total[family]})
        rows.append(row)
    return rows


def _score_episode(job) -> tuple[int, dict]:
    model_path, seed, duration_s, policy, budget, thresholds, spacing_s = job
    if multiprocessing.current_process().name != "MainProcess":
        torch.set_num_threads(1)
    rendered = render_episode(seed, duration_s)
    cells = {}
    for threshold in thresholds:
        cells[threshold] = EvalResult()
        session = make_session(model_path, policy, budget, max(int(RECENT_SHARE * budget), 1) if budget else 0,
                               prune_similarity=threshold)
        evaluate_episode(session, seed, duration_s, cells[threshold], rendered, spacing_s)
    return seed, cells
