"""Quality suite: accuracy per question family and evidence kept, policies x budgets, long episodes.

Where the claim is tested that attention saddles keep what StreamingLLM forgets. Budgets are
shares of a stream's tokens, measured under `full` on the first episode. Two readings per cell:
the model's accuracy (bounded by how well the embedded model reads memory at all) and the share of
the evidence (the tokens of the frames that showed the object asked about) still in the cache at
question time, which depends on the policy alone.
"""

from __future__ import annotations

from tqdm import tqdm

from infmllm_ros.evaluation import EvalResult, evaluate_episode, render_episode, wilson_interval
from infmllm_ros.synthetic import FAMILIES

from .measure import make_session

BUDGET_SHARES = (0.05, 0.10, 0.25)
BOUNDED = ("streaming", "h2o", "infmllm")
FIRST_SEED = 1_000   # held out: training used seeds from 90,000 up
RECENT_SHARE = 0.25  # of each budget, the newest tokens always kept (infmllm, h2o)


def cell_row(policy: str, budget, share: str, result: EvalResult) -> dict:
    accuracy, kept = result.accuracy(), result.mean_evidence_kept()
    row = {"policy": policy, "budget": budget, "share": share}
    for f in FAMILIES:
        low, high = wilson_interval(result.correct[f], result.total[f])
        row.update({f"acc_{f}": 100 * accuracy[f], f"lo_{f}": 100 * low, f"hi_{f}": 100 * high,
                    f"n_{f}": result.total[f]})
        if f != "current":
            row[f"kept_{f}"] = 100 * kept[f]
    return row


def add_share_of_full(rows: list[dict]) -> None:
    """Each cell's accuracy as a share (%) of the full cache's, per family."""
    full = next(row for row in rows if row["policy"] == "full")
    for row in rows:
        for f in FAMILIES:
            reference = full[f"acc_{f}"]
            row[f"of_full_{f}"] = 100 * row[f"acc_{f}"] / reference if reference else float("nan")


def run_quality(model_path, episodes: int, duration_s: float, shares=BUDGET_SHARES, policies=BOUNDED,
                spacing_s: float = 3.0) -> list[dict]:
    """Rows for `full` and for each bounded policy at each budget share.

    Episodes are the outer loop, so each is rendered once and streamed into every cell.
    """
    seeds = range(FIRST_SEED, FIRST_SEED + episodes)
    full = make_session(model_path, "full", 1, 0)
    cells: dict[tuple[str, float], tuple] = {}
    results = {("full", 1.0): EvalResult()}
    stream_tokens = None
    progress = tqdm(total=episodes * (1 + len(shares) * len(policies)), desc="quality", unit="cell-episode")
    for seed in seeds:
        rendered = render_episode(seed, duration_s)
        evaluate_episode(full, seed, duration_s, results[("full", 1.0)], rendered, spacing_s)
        progress.update()
        if stream_tokens is None:
            stream_tokens = full.cache.tokens_seen
            for share in shares:
                budget = int(share * stream_tokens)
                for policy in policies:
                    cells[(policy, share)] = make_session(model_path, policy, budget,
                                                          max(int(RECENT_SHARE * budget), 1))
                    results[(policy, share)] = EvalResult()
        for key, session in cells.items():
            evaluate_episode(session, seed, duration_s, results[key], rendered, spacing_s)
            progress.update()
    progress.close()
    rows = [cell_row("full", "all", "100 %", results[("full", 1.0)])]
    rows += [cell_row(policy, cells[(policy, share)].policy.budget, f"{100 * share:.0f} %", results[(policy, share)])
             for share in shares for policy in policies]
    for row in rows:
        row["stream_tokens"] = stream_tokens
    add_share_of_full(rows)
    return rows
