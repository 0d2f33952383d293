"""GPU variant of the scale and overhead suites, for a CUDA machine: bf16 weights, bitsandbytes nf4.

    python -m infmllm_ros.benchmarks.gpu [--model-path DIR] [--quick]

One script, so a lent device machine runs it in one call: it checks CUDA and bitsandbytes first
(and fails with the reason if either is missing), runs both suites under each of `bf16` and
`nf4`, writes bench/results/gpu_*.json and .png, and prints its tables last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from infmllm_ros.models import embedded_model_path

from .overhead import run_overhead
from .report import RESULTS_DIR, line_plot, markdown_table, write_json
from .scale import METRICS, ratios, run_scale

MODES = {"bf16": {"device": "cuda", "dtype": "bfloat16", "quantization": "none"},
         "nf4": {"device": "cuda", "dtype": "bfloat16", "quantization": "nf4"}}


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
    args = parser.parse_args(argv)
    print(f"gpu bench: {environment()}", flush=True)
    model_path = args.model_path or str(embedded_model_path())
    out = Path(args.out)
    checkpoints = [16, 100, 128] if args.quick else [16, 100, 300, 1000, 3600]
    overhead_size = (60, 100, [1024, 4096]) if args.quick else (600, 1000, [1024, 4096, 16384, 65536, 262144])
    tables = []
    for mode, overrides in MODES.items():
        rows = run_scale(model_path, checkpoints, args.budget, args.recent, overrides=overrides)
        ratio_rows = ratios(rows)
        steps, selection = run_overhead(model_path, *overhead_size[:2], args.budget, args.recent, overhead_size[2],
                                        overrides)
        write_json(f"gpu_{mode}", {"scale": rows, "ratios": ratio_rows, "steps": steps, "selection": selection,
                                   "overrides": overrides, "environment": environment()}, out)
        line_plot(f"gpu_{mode}_scale", rows, "frames", ["cache_mb", "gpu_peak_mb", "ingest_ms", "decode_ms"],
                  "policy", out)
        tables += [f"## GPU {mode}: scale, budget {args.budget}\n\n"
                   + markdown_table(rows, ["policy", "frames", *METRICS, "gpu_peak_mb"]),
                   f"## GPU {mode}: last checkpoint / 100 frames\n\n" + markdown_table(ratio_rows, ["policy", "frames", *METRICS]),
                   f"## GPU {mode}: overhead per step\n\n" + markdown_table(steps, list(steps[0])),
                   f"## GPU {mode}: one selection on the GPU\n\n"
                   + markdown_table(selection, list(selection[0]))]
    print("\n\n" + "\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
