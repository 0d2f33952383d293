"""`infmllm-bench`: measure every cache policy side by side, in one run on one machine.

Suites (each prints a markdown table and writes bench/results/<suite>[_quick].json and .png):
scale, quality, recall, saddles, pruning, overhead, text, node, realsize, quant; `all` runs scale, quality, overhead,
text, node and realsize, in that order, with one progress bar. `--quick` is the small size CI
smoke-tests; without it, `all` takes about an hour and a half on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from infmllm_ros.models import embedded_model_path
from infmllm_ros.synthetic import FAMILIES

from .node_e2e import run_node_e2e
from .overhead import run_overhead
from .pruning import OFF, VARIANTS as PRUNE_VARIANTS, plot_lines, run_pruning
from .quality import (BOUNDED, BUDGET_SHARES, RECALL_FRAMES, RECALL_SHARES, RECALL_STORE_MB, cell_settings,
                      run_quality, saddle_cell)
from .quant import run_quant
from .realsize import FULL_SIZE, QUICK_SIZE, realsize_plot, run_realsize
from .report import RESULTS_DIR, accuracy_plot, bar_plot, line_plot, markdown_table, tradeoff_plot, write_json
from .scale import METRICS, POLICIES, ratios, run_scale
from .text_stream import VARIANTS, run_text
from .two_cameras import JPEG_HZ, RAW_HZ, run_two_cameras

SUITES = ("scale", "quality", "recall", "saddles", "pruning", "overhead", "text", "node", "realsize", "quant")
ALL = ("scale", "quality", "overhead", "text", "node", "realsize")


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor() or
            platform.machine(), "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


class Suite:
    """One suite's run: its name, size, output folder and what it writes."""

    def __init__(self, name: str, args) -> None:
        self.name, self.args = name, args
        self.quick = args.quick
        self.out = Path(args.out)
        self.file = f"{name}_quick" if args.quick else name
        self.started = time.perf_counter()

    def table(self, title: str, rows, columns) -> None:
        print(f"\n## {title}\n\n{markdown_table(rows, columns)}", flush=True)

    def save(self, payload: dict) -> None:
        payload.update(suite=self.name, quick=self.quick, machine=machine(), command=" ".join(sys.argv),
                       elapsed_s=round(time.perf_counter() - self.started, 1))
        print(f"\njson: {write_json(self.file, payload, self.out)}", flush=True)

    def plot(self, path: Path) -> None:
        print(f"plot: {path}", flush=True)


def scale_suite(suite: Suite, model_path: str, args, overrides: dict | None = None) -> None:
    checkpoints = [16, 100, 128] if suite.quick else [16, 100, 300, 1000, 3600]
    rows = run_scale(model_path, checkpoints, args.budget, args.recent, args.policies, args.full_max_frames,
                     overrides)
    columns = ["policy", "frames", *METRICS] + (["gpu_peak_mb"] if any("gpu_peak_mb" in r for r in rows) else [])
    suite.table(f"Scale: budget {args.budget} tokens/layer, recent {args.recent}", rows, columns)
    ratio_rows = ratios(rows)
    suite.table("Scale: each figure at the last checkpoint / at 100 frames", ratio_rows, ["policy", "frames", *METRICS])
    suite.save({"rows": rows, "ratios": ratio_rows, "budget": args.budget, "recent": args.recent,
                "full_max_frames": args.full_max_frames, "overrides": overrides or {}})
    suite.plot(line_plot(suite.file, rows, "frames",
                         ["cache_mb", "store_mb", "peak_rss_mb", "ingest_ms", "ttft_ms", "decode_ms"], "policy",
                         suite.out))


def quality_suite(suite: Suite, model_path: str, args) -> None:
    episodes, duration, shares = (1, 60.0, (0.25,)) if suite.quick else (args.episodes, 600.0, BUDGET_SHARES)
    rows = run_quality(model_path, episodes, duration, shares, spacing_s=args.spacing, workers=args.workers)
    quality_tables(suite, rows, episodes, duration, args)
    suite.plot(accuracy_plot(suite.file, rows, FAMILIES, suite.out))


def recall_suite(suite: Suite, model_path: str, args) -> None:
    """The quality suite's cells at small budgets, with infmllm + recall beside the policies."""
    episodes, duration, shares = (1, 60.0, (0.25,)) if suite.quick else (args.episodes, 600.0, RECALL_SHARES)
    policies = ("infmllm", "infmllm+recall") if suite.quick else (*BOUNDED, "infmllm+recall")
    rows = run_quality(model_path, episodes, duration, shares, policies=policies, spacing_s=args.spacing,
                       workers=args.workers)
    quality_tables(suite, rows, episodes, duration, args)
    suite.table(f"Recall ({RECALL_FRAMES} frames from a store of up to {RECALL_STORE_MB:g} MB): time to first "
                "token, store size, and the distant questions whose recalled frames include one of the evidence's",
                rows, ["policy", "share", "ttft_p50_ms", "store_mb", "recall_found_distant"])
    suite.plot(accuracy_plot(suite.file, rows, FAMILIES, suite.out))


#: the saddles suite's grid: the decay that trades old saddles for new context (the method's "attention
#: bias"), with each key scored alone and with the local sum over 5 neighbours
SADDLE_BIASES, SADDLE_POOLS, SADDLE_SHARES = (0.0, 0.05, 0.1, 0.2), (1, 5), (0.05, 0.10)


def saddles_suite(suite: Suite, model_path: str, args) -> None:
    """InfMLLM's two selection settings swept beside H2O at budgets where most of the stream is
    evicted: how much of the long / distant trade each buys."""
    if suite.quick:
        episodes, duration, shares = 1, 60.0, (0.25,)
        cells = [saddle_cell(0.2, 1), saddle_cell(0.0, 5)]
    else:
        episodes, duration, shares = args.episodes, 600.0, SADDLE_SHARES
        cells = ["h2o", *(saddle_cell(bias, pool) for pool in SADDLE_POOLS for bias in SADDLE_BIASES)]
    rows = run_quality(model_path, episodes, duration, shares, policies=cells, spacing_s=args.spacing,
                       workers=args.workers)
    for row in rows:
        settings = cell_settings(row["policy"])[1]
        row["attention_bias"] = settings.get("attention_bias", 0.0)   # h2o and full forget nothing
        row["saddle_pool"] = settings.get("saddle_pool", 1)
    quality_tables(suite, rows, episodes, duration, args)
    lines = {}
    for row in rows:   # one line per pool and budget, h2o and full as points at bias 0
        name = row["policy"].split()[0] + (f", pool {row['saddle_pool']}" if row["policy"].startswith("infmllm ")
                                           else "")
        lines.setdefault(f"{name}, {row['share']}" if name != "full" else name, []).append(row)
    suite.plot(tradeoff_plot(suite.file, lines, FAMILIES, "attention_bias", "attention_bias", suite.out))


#: the node's default for the embedded model: infmllm, 1,024 tokens (16 frames), recent 256
NODE_DEFAULT_BUDGET = 1024


def pruning_suite(suite: Suite, model_path: str, args) -> None:
    """Accuracy against tokens appended per frame: the full cache on 64 s episodes, and the node's
    default cache on 10-minute ones."""
    if suite.quick:
        settings = [("full", 0, 2, 32.0, (OFF, ("token", 0.99), ("frame", 0.99)))]
    else:   # ten-minute episodes: the thresholds that cost the fewest 64 s answers per token saved, and off
        settings = [("full", 0, 20, 64.0, PRUNE_VARIANTS),
                    ("infmllm", NODE_DEFAULT_BUDGET, args.episodes, 600.0,
                     (OFF, ("token", 0.999), ("token", 0.995), ("frame", 0.999), ("frame", 0.995)))]
    rows = []
    for policy, budget, episodes, duration, variants in settings:
        rows += run_pruning(model_path, episodes, duration, policy, budget, variants, args.spacing, args.workers)
    for row in rows:
        row["threshold"] = f"{row['prune_similarity']:g}"
        for family in FAMILIES:
            row[family] = (f"{row[f'acc_{family}']:.1f} ({row[f'lo_{family}']:.0f}-{row[f'hi_{family}']:.0f})"
                           if row[f"n_{family}"] else "-")
    suite.table("Temporal pruning: tokens appended per frame and accuracy % (95 % Wilson interval) by "
                "prune_unit and prune_similarity", rows,
                ["setting", "prune_unit", "threshold", "tokens_per_frame", "kept_pct", *FAMILIES,
                 *(f"n_{f}" for f in FAMILIES)])
    suite.save({"rows": rows, "settings": [list(setting[:4]) for setting in settings], "spacing_s": args.spacing})
    suite.plot(tradeoff_plot(suite.file, plot_lines(rows), FAMILIES, "tokens_per_frame", "prune_similarity",
                             suite.out))


def quality_tables(suite: Suite, rows: list[dict], episodes: int, duration: float, args) -> None:
    for row in rows:
        for family in FAMILIES:
            row[family] = f"{row[f'acc_{family}']:.1f} ({row[f'lo_{family}']:.0f}-{row[f'hi_{family}']:.0f})"
    suite.table(f"Quality: {episodes} held-out episodes of {duration:.0f} s, a question every {args.spacing:g} s; "
                "accuracy % (95 % Wilson interval)", rows,
                ["policy", "share", "budget", *FAMILIES, *(f"n_{f}" for f in FAMILIES)])
    suite.table("Quality: evidence still cached at question time (%), and accuracy as a share of full's (%)", rows,
                ["policy", "share", *(f"kept_{f}" for f in FAMILIES if f != "current"),
                 *(f"of_full_{f}" for f in FAMILIES)])
    suite.save({"rows": rows, "episodes": episodes, "duration_s": duration, "spacing_s": args.spacing,
                "workers": args.workers})


def overhead_suite(suite: Suite, model_path: str, args, overrides: dict | None = None) -> None:
    frames, steps, lengths = (60, 100, [1024, 4096]) if suite.quick else (600, 1000, [1024, 4096, 16384, 65536])
    step_rows, select_rows = run_overhead(model_path, frames, steps, args.budget, args.recent, lengths, overrides)
    suite.table(f"Overhead per step: {frames} frames then {steps} decoding steps, budget {args.budget}", step_rows,
                ["config", "frame_ms", "frame_evict_ms", "token_ms", "token_evict_ms", "cache_tokens"])
    suite.table(f"Overhead: one selection (keep_indices) down to budget {args.budget}", select_rows,
                ["policy", "cache_length", "select_us"])
    suite.save({"steps": step_rows, "selection": select_rows, "budget": args.budget, "overrides": overrides or {}})
    suite.plot(bar_plot(suite.file, step_rows, "config", ["frame_ms", "token_ms", "token_evict_ms"], suite.out))
    suite.plot(line_plot(f"{suite.file}_selection", select_rows, "cache_length", ["select_us"], "policy", suite.out))


def text_suite(suite: Suite, model_path: str, args) -> None:
    total, full_max = (4096, 4096) if suite.quick else (args.text_tokens, args.full_max_tokens)
    rows = run_text(model_path, total, 1024, 256, full_max)
    suite.table(f"Text stream: answer-token perplexity by position, {total:,} tokens, budget 1024 "
                f"(full up to {full_max:,})", rows, ["variant", "from", "to", "ppl", "cache_tokens"])
    suite.save({"rows": rows, "tokens": total, "full_max_tokens": full_max, "variants": list(VARIANTS)})
    suite.plot(line_plot(suite.file, rows, "to", ["ppl"], "variant", suite.out, logy=True))


def node_suite(suite: Suite, model_path: str, args) -> None:
    duration = 20.0 if suite.quick else 600.0
    row = run_node_e2e(duration, Path(args.cache_dir) / f"node_bag_{duration:.0f}s_30hz")
    suite.table(f"Node end to end: {duration:.0f} s bag at 30 Hz into the node over DDS", [row],
                [key for key in row if key != "slow_items"])
    cameras = run_two_cameras(duration)
    suite.table(f"Two cameras for {duration:.0f} s: rgb8 at {RAW_HZ:g} Hz and JPEG at {JPEG_HZ:g} Hz into one node",
                [cameras], [key for key in cameras if key not in ("rss_mb", "slow_items")])
    slow = [{"run": run, **item} for run, items in (("one camera", row["slow_items"]),
                                                    ("two cameras", cameras["slow_items"])) for item in items]
    if slow:
        suite.table("Slow frames and answers (the node's ~/stats slow_work, last 20 per run): where the time went",
                    slow, ["run", "at", "kind", "ms", "median_ms", "waited_ms", "worked_ms", "worker_cpu_ms", "gc_ms",
                           "off_cpu_ms", "detail"])
    suite.save({"row": row, "two_cameras": cameras})
    bars = [{"measure": label, **{f"p{q}_ms": row[f"{name}_p{q}_ms"] for q in (50, 95, 99)}}
            for name, label in (("observed", "observed"), ("node", "node"), ("engine", "engine"),
                                ("engine_paced", "engine\npaced"))]
    suite.plot(bar_plot(suite.file, bars, "measure", ["p50_ms", "p95_ms", "p99_ms"], suite.out))
    memory = [{"seconds": t, "node_rss_mb": mb, "run": "two cameras"} for t, mb in cameras["rss_mb"]]
    suite.plot(line_plot(f"{suite.file}_two_cameras_rss", memory, "seconds", ["node_rss_mb"], "run", suite.out,
                         logx=False))


def realsize_suite(suite: Suite, model_path: str, args) -> None:
    size = QUICK_SIZE if suite.quick else FULL_SIZE
    result = run_realsize(Path(args.cache_dir), size)
    bandwidth = result["bandwidth"]
    suite.table(f"Real-size models on this machine: weights, ingest of a 640x480 frame, time to first token after "
                f"{size.frames} frames, KV after an hour at 1 frame/s (memory bandwidth read "
                f"{bandwidth['read_gbs']:.1f} GB/s, copy {bandwidth['copy_gbs']:.1f} GB/s)", result["summaries"],
                ["model", "mode", "weights_mb", "decode_weights_mb", "frame_tokens", "ingest_ms", "ttft_ms", "decode_steps",
                 "weights_floor_ms", "linears_ms", "linears_of_floor_pct", "hour_kv_full_mb", "hour_kv_infmllm_mb", "rss_loaded_mb", "skipped"])
    suite.table(f"Decode ms/token against the floor (bytes read per token / {bandwidth['read_gbs']:.1f} GB/s); "
                f"infmllm budget {size.budget:,}", result["cells"],
                ["model", "mode", "runner", "context", "cache_tokens", "decode_ms", "floor_ms", "of_floor_pct",
                 "linears_share_pct", "eviction_ms", "kv_mb", "reserved_mb", "rss_mb"])
    suite.save({**result, "size": vars(size)})
    suite.plot(realsize_plot(suite.file, result["cells"], suite.out))


def quant_suite(suite: Suite, model_path: str, args) -> None:
    episodes, duration = (2, 32.0) if suite.quick else (10, 64.0)
    rows = run_quant(model_path, episodes, duration)
    suite.table(f"Quantization: {episodes} held-out episodes of {duration:.0f} s", rows,
                ["mode", "model_mb", "ingest_ms", "decode_ms", "acc_current", "acc_recent", "acc_long", "error"])
    suite.save({"rows": rows})
    measured = [row for row in rows if "error" not in row]
    suite.plot(bar_plot(suite.file, measured, "mode", ["model_mb", "decode_ms", "acc_current"], suite.out))


RUNNERS = {"scale": scale_suite, "quality": quality_suite, "recall": recall_suite, "saddles": saddles_suite,
           "pruning": pruning_suite,
           "overhead": overhead_suite, "text": text_suite, "node": node_suite, "realsize": realsize_suite,
           "quant": quant_suite}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    p.add_argument("--quick", action="store_true", help="the small size CI smoke-tests")
    p.add_argument("--model-path", default=None, help="model directory (default: the embedded model)")
    p.add_argument("--budget", type=int, default=512, help="cache tokens per layer (scale, overhead)")
    p.add_argument("--recent", type=int, default=128, help="recent window (scale, overhead)")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES, help="scale suite policies")
    p.add_argument("--full-max-frames", type=int, default=3600, help="scale: stop `full` here")
    p.add_argument("--episodes", type=int, default=3, help="quality: 10-minute episodes")
    p.add_argument("--spacing", type=float, default=3.0, help="quality: seconds between questions")
    p.add_argument("--workers", type=int, default=1, help="quality: episodes scored at once (a process each)")
    p.add_argument("--text-tokens", type=int, default=1_048_576, help="text: tokens streamed")
    p.add_argument("--full-max-tokens", type=int, default=32_768, help="text: stop `full` here")
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--cache-dir", default="bench/cache", help="generated bags and model directories")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    model_path = args.model_path or str(embedded_model_path())
    names = ALL if args.suite == "all" else (args.suite,)
    elapsed = {}
    for name in tqdm(names, desc="suites", unit="suite", disable=len(names) == 1):
        suite = Suite(name, args)
        RUNNERS[name](suite, model_path, args)
        elapsed[name] = time.perf_counter() - suite.started
    if len(names) > 1:
        print("\n## Time per suite\n\n" + markdown_table([{"suite": k, "seconds": v} for k, v in elapsed.items()],
                                                        ["suite", "seconds"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
