"""GPU variant of the realsize, scale and overhead suites, for a CUDA machine: bf16 weights, bitsandbytes nf4.

    python -m infmllm_ros.benchmarks.gpu [--model-path DIR] [--quick] [--suites realsize,scale,overhead]

One script, so a lent device machine runs it in one call: it checks CUDA and bitsandbytes first
(and fails with the reason if either is missing), runs each suite under each of `bf16` and
`nf4`, writes bench/results/gpu_*.json and .png after each suite, and prints its tables last.
realsize is first: the real-sized models (SmolVLM-256M, Qwen2-VL-2B shapes, random weights) are
what a robot runs; scale and overhead use the embedded model, whose 3 M parameters leave the GPU
idle between kernel launches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from infmllm_ros.models import embedded_model_path

from .overhead import run_overhead
from .realsize import CUDA_MODES as MODES
from .realsize import FULL_SIZE, MODELS, QUICK_SIZE, realsize_plot, run_realsize
from .report import RESULTS_DIR, line_plot, markdown_table, write_json
from .scale import METRICS, ratios, run_scale

SUITES = ("realsize", "scale", "overhead")


def environment() -> str:
    """What the run needs, checked up front: a CUDA device and bitsandbytes."""
    if not torch.cuda.is_available():
        raise SystemExit("gpu bench: CUDA is not available (torch %s)" % torch.__version__)
    try:
        import bitsandbytes
    except ImportError as error:
        raise SystemExit(f"gpu bench: bitsandbytes is needed for nf4 ({error})")
    return (f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
            f"bitsandbytes {bitsandbytes.__version__}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--recent", type=int, default=128)
    parser.add_argument("--out", default=str(RESULTS_DIR))
    parser.add_argument("--cache-dir", default="bench/cache", help="where realsize writes its model directories")
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated, of {', '.join(SUITES)}")
    args = parser.parse_args(argv)
    suites = [name for name in args.suites.split(",") if name]
    if unknown := set(suites) - set(SUITES):
        parser.error(f"unknown suites {sorted(unknown)}; choose from {', '.join(SUITES)}")
    print(f"gpu bench: {environment()}", flush=True)
    model_path = args.model_path or str(embedded_model_path())
    out = Path(args.out)
    tables = []
    if "realsize" in suites:
        tables += realsize_tables(Path(args.cache_dir), QUICK_SIZE if args.quick else FULL_SIZE, out)
    if {"scale", "overhead"} & set(suites):
        tables += embedded_tables(model_path, args, suites, out)
    print("\n\n" + "\n\n".join(tables))
    return 0


def realsize_tables(cache_dir: Path, size, out: Path) -> list[str]:
    """Each model's figures written as soon as they are measured (a device call may end mid-suite)."""
    summaries, cells = [], []
    for name in MODELS:
        result = run_realsize(cache_dir, size, models=(name,), modes=MODES)
        bandwidth = result["bandwidth"]
        summaries += result["summaries"]
        cells += result["cells"]
        write_json("gpu_realsize", {"bandwidth": bandwidth, "summaries": summaries, "cells": cells,
                                    "size": vars(size), "environment": environment()}, out)
        realsize_plot("gpu_realsize", cells, out)
    return [f"## GPU realsize ({bandwidth['device']}, memory read {bandwidth['read_gbs']:.0f} GB/s, copy "
            f"{bandwidth['copy_gbs']:.0f} GB/s)\n\n"
            + markdown_table(summaries, ["model", "mode", "weights_mb", "decode_weights_mb", "frame_tokens",
                                         "ingest_ms", "ttft_ms", "decode_steps", "hour_kv_full_mb",
                                         "hour_kv_infmllm_mb"]),
            f"## GPU realsize: decode ms/token against the floor; infmllm budget {size.budget:,}\n\n"
            + markdown_table(cells, ["model", "mode", "runner", "context", "cache_tokens", "decode_ms", "floor_ms",
                                     "of_floor_pct", "eviction_ms", "kv_mb", "gpu_peak_mb"])]


def embedded_tables(model_path: str, args, suites: list[str], out: Path) -> list[str]:
    """The scale and overhead suites on the embedded model under each mode."""
    checkpoints = [16, 100, 128] if args.quick else [16, 100, 300, 1000, 3600]
    overhead_size = (60, 100, [1024, 4096]) if args.quick else (600, 1000, [1024, 4096, 16384, 65536, 262144])
    tables = []
    for mode, overrides in MODES.items():
        payload = {"overrides": overrides, "environment": environment()}
        if "scale" in suites:
            rows = run_scale(model_path, checkpoints, args.budget, args.recent, overrides=overrides)
            payload.update(scale=rows, ratios=ratios(rows))
            line_plot(f"gpu_{mode}_scale", rows, "frames", ["cache_mb", "gpu_peak_mb", "ingest_ms", "decode_ms"],
                      "policy", out)
            tables += [f"## GPU {mode}: scale, budget {args.budget}\n\n"
                       + markdown_table(rows, ["policy", "frames", *METRICS, "gpu_peak_mb"]),
                       f"## GPU {mode}: last checkpoint / 100 frames\n\n"
                       + markdown_table(payload["ratios"], ["policy", "frames", *METRICS])]
        if "overhead" in suites:
            steps, selection = run_overhead(model_path, *overhead_size[:2], args.budget, args.recent,
                                            overhead_size[2], overrides)
            payload.update(steps=steps, selection=selection)
            tables += [f"## GPU {mode}: overhead per step\n\n" + markdown_table(steps, list(steps[0])),
                       f"## GPU {mode}: one selection on the GPU\n\n" + markdown_table(selection, list(selection[0]))]
        write_json(f"gpu_{mode}", payload, out)
    return tables


if __name__ == "__main__":
    sys.exit(main())
