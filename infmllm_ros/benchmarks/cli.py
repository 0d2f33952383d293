"""`infmllm-bench`: measure the engine. `--quick` is the small run CI smoke-tests."""

from __future__ import annotations

import argparse

from infmllm_ros.models import embedded_model_path

from .report import RESULTS_DIR, line_plot, markdown_table, write_json
from .scale import POLICIES, run_scale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64/256/1024 frames on the embedded model")
    parser.add_argument("--model-path", default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--budget", type=int, default=512, help="cache tokens per layer for bounded policies")
    parser.add_argument("--recent", type=int, default=128)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)

    model_path = args.model_path or str(embedded_model_path())
    checkpoints = [64, 256, 1024] if args.quick else [16, 100, 300, 1000, 3600]
    rows = run_scale(model_path, checkpoints, args.budget, args.recent, args.policies)
    print(f"\n## Scale: budget {args.budget} tokens/layer, model {model_path}\n")
    print(markdown_table(rows, ["policy", "frames", "cache_tokens", "cache_mb", "ingest_ms"]))
    name = "scale_quick" if args.quick else "scale"
    from pathlib import Path
    write_json(name, rows, Path(args.out))
    print(f"\nplot: {line_plot(name, rows, 'frames', ['cache_tokens', 'cache_mb', 'ingest_ms'], 'policy', Path(args.out))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
