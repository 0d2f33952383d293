"""Quality suite: accuracy per question family and evidence kept, policies x budgets, long episodes.

Where the claim is tested that attention saddles keep what StreamingLLM forgets. Budgets are
shares of a stream's tokens, measured under `full` on the first episode. Two readings per cell:
the model's accuracy (bounded by how well the embedded model reads memory at all) and the share of
the evidence (the tokens of the frames that showed the object asked about) still in the cache at
question time, which depends on the policy alone.
"""

from __future__ import annotations

import multiprocessing

import torch
from tqdm import tqdm

from infmllm_ros.evaluation import EvalResult, evaluate_episode, render_episode, wilson_interval
from infmllm_ros.synthetic import FAMILIES

from .measure import make_session, score_episodes

BUDGET_SHARES = (0.05, 0.10, 0.25)
BOUNDED = ("streaming", "h2o", "infmllm")
#: cells that are a policy plus session settings: infmllm with evicted frames recalled by question
RECALL_STORE_MB, RECALL_FRAMES = 256.0, 4
RECALL_SHARES = (0.05, 0.10)   # where recall is meant to help: most of the stream evicted
VARIANTS = {"infmllm+recall": ("infmllm", {"recall_store_mb": RECALL_STORE_MB, "recall_frames": RECALL_FRAMES})}


def saddle_cell(attention_bias: float, pool: int) -> str:
    """The cell name of infmllm with these saddle settings (the saddles suite's cells)."""
    return f"infmllm bias={attention_bias:g} pool={pool}"


def cell_settings(name: str) -> tuple[str, dict]:
    """(policy, session settings) of a cell name: a policy, a VARIANTS entry or a saddle_cell. Names,
    not objects, travel to the spawned scoring processes, so the settings must be read back from them."""
    if name in VARIANTS:
        return VARIANTS[name]
    if name.startswith("infmllm bias="):
        bias, pool = (part.split("=")[1] for part in name.split()[1:])
        return "infmllm", {"attention_bias": float(bias), "saddle_pool": int(pool)}
    return name, {}
FIRST_SEED = 1_000   # held out: training used seeds from 90,000 up
RECENT_SHARE = 0.25  # of each budget, the newest tokens always kept (infmllm, h2o)


def accuracy_columns(result: EvalResult) -> dict:
    """acc_/lo_/hi_/n_<family>: accuracy % with its 95 % Wilson interval and the questions asked."""
    accuracy, columns = result.accuracy(), {}
    for f in FAMILIES:
        low, high = wilson_interval(result.correct[f], result.total[f])
        columns.update({f"acc_{f}": 100 * accuracy[f], f"lo_{f}": 100 * low, f"hi_{f}": 100 * high,
                        f"n_{f}": result.total[f]})
    return columns


def cell_row(policy: str, budget, share: str, result: EvalResult) -> dict:
    kept = result.mean_evidence_kept()
    row = {"policy": policy, "budget": budget, "share": share, "ttft_p50_ms": result.ttft_p50_ms()}
    if result.recall_hits:
        hits, recalled = result.recall_hits.get("distant", (0, 0))
        row["recall_found_distant"] = 100 * hits / recalled if recalled else float("nan")
        row["store_mb"] = result.store_mb
    row.update(accuracy_columns(result))
    row.update({f"kept_{f}": 100 * kept[f] for f in FAMILIES if f != "current"})
    return row


def add_share_of_full(rows: list[dict]) -> None:
    """Each cell's accuracy as a share (%) of the full cache's, per family."""
    full = next(row for row in rows if row["policy"] == "full")
    for row in rows:
        for f in FAMILIES:
            reference = full[f"acc_{f}"]
            row[f"of_full_{f}"] = 100 * row[f"acc_{f}"] / reference if reference else float("nan")


def run_quality(model_path, episodes: int, duration_s: float, shares=BUDGET_SHARES, policies=BOUNDED,
                spacing_s: float = 3.0, workers: int = 1) -> list[dict]:
    """Rows for `full` and for each bounded policy at each budget share.

    Budgets are shares of the first episode's tokens under `full`, measured first; then each
    episode is rendered once and streamed into every cell, `workers` episodes at a time (one
    process and one torch thread each: a 4.5 M-parameter model gains little from a second thread,
    and episodes are independent).
    """
    seeds = list(range(FIRST_SEED, FIRST_SEED + episodes))
    progress = tqdm(total=episodes * (1 + len(shares) * len(policies)), desc="quality", unit="cell-episode")
    results = {("full", 1.0): EvalResult()}
    full = make_session(model_path, "full", 1, 0)
    evaluate_episode(full, seeds[0], duration_s, results[("full", 1.0)], render_episode(seeds[0], duration_s),
                     spacing_s)
    progress.update()
    stream_tokens = full.cache.tokens_seen
    del full
    budgets = {(policy, share): int(share * stream_tokens) for share in shares for policy in policies}
    jobs = [(model_path, seed, duration_s, budgets, spacing_s, seed != seeds[0]) for seed in seeds]
    by_seed = score_episodes(_score_episode, jobs, workers, progress, weight=len)
    progress.close()
    for seed in seeds:   # merged in seed order, so mistakes and answers read the same at any worker count
        for key, result in by_seed[seed].items():
            results.setdefault(key, EvalResult()).merge(result)
    rows = [cell_row("full", "all", "100 %", results[("full", 1.0)])]
    rows += [cell_row(policy, budgets[(policy, share)], f"{100 * share:.0f} %", results[(policy, share)])
             for share in shares for policy in policies]
    for row in rows:
        row["stream_tokens"] = stream_tokens
    add_share_of_full(rows)
    return rows


def _score_episode(job) -> tuple[int, dict]:
    """One episode streamed into every cell (and into `full`, unless already scored)."""
    model_path, seed, duration_s, budgets, spacing_s, with_full = job
    if multiprocessing.current_process().name != "MainProcess":
        torch.set_num_threads(1)
    rendered = render_episode(seed, duration_s)
    cells = {}
    if with_full:
        cells[("full", 1.0)] = EvalResult()
        evaluate_episode(make_session(model_path, "full", 1, 0), seed, duration_s, cells[("full", 1.0)], rendered,
                         spacing_s)
    for (policy, share), budget in budgets.items():
        cells[(policy, share)] = EvalResult()
        base, settings = cell_settings(policy)
        session = make_session(model_path, base, budget, max(int(RECENT_SHARE * budget), 1), **settings)
        evaluate_episode(session, seed, duration_s, cells[(policy, share)], rendered, spacing_s)
        if session.cache.store is not None:
            cells[(policy, share)].store_mb = session.cache.store.megabytes
    return seed, cells
