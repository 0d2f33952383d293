"""`infmllm-bench`: measure the engine. `--quick` is the small run CI smoke-tests."""

from __future__ import annotations

import argparse

from infmllm_ros.models import embedded_model_path

from pathlib import Path

from .quant import run_quant
from .report import RESULTS_DIR, bar_plot, line_plot, markdown_table, write_json
from .scale import POLICIES, run_scale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["scale", "quant"], default="scale")
    parser.add_argument("--quick", action="store_true", help="the small size CI smoke-tests")
    parser.add_argument("--model-path", default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--budget", type=int, default=512, help="cache tokens per layer for bounded policies")
    parser.add_argument("--recent", type=int, default=128)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)

    model_path = args.model_path or str(embedded_model_path())
    if args.suite == "quant":
        return quant_suite(model_path, args)
    checkpoints = [64, 256, 1024] if args.quick else [16, 100, 300, 1000, 3600]
    rows = run_scale(model_path, checkpoints, args.budget, args.recent, args.policies)
    print(f"\n## Scale: budget {args.budget} tokens/layer, model {model_path}\n")
    print(markdown_table(rows, ["policy", "frames", "cache_tokens", "cache_mb", "ingest_ms"]))
    name = "scale_quick" if args.quick else "scale"
    write_json(name, rows, Path(args.out))
    print(f"\nplot: {line_plot(name, rows, 'frames', ['cache_tokens', 'cache_mb', 'ingest_ms'], 'policy', Path(args.out))}")
    return 0


def quant_suite(model_path: str, args) -> int:
    episodes, duration = (2, 32.0) if args.quick else (10, 64.0)
    rows = run_quant(model_path, episodes, duration)
    print(f"\n## Quantization: {episodes} held-out episodes of {duration:.0f} s, model {model_path}\n")
    print(markdown_table(rows, ["mode", "model_mb", "ingest_ms", "decode_ms", "acc_current", "acc_recent",
                                "acc_long", "error"]))
    name = "quant_quick" if args.quick else "quant"
    write_json(name, rows, Path(args.out))
    measured = [row for row in rows if "error" not in row]
    print(f"\nplot: {bar_plot(name, measured, 'mode', ['model_mb', 'decode_ms', 'acc_current'], Path(args.out))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
