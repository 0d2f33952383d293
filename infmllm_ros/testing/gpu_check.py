"""The engine on a CUDA device, checked against the CPU: `python -m infmllm_ros.testing.gpu_check`.

For a lent GPU machine (CI has none): the same 20 frames and questions through the embedded model
on the CPU (fp32) and on CUDA in fp32, bf16 and bf16 + bitsandbytes nf4, each with the Triton
kernel and with the torch reference: answers, evictions, cache size, last logits against the CPU's;
then `infmllm-eval` on CUDA (5 held-out 64 s episodes, seeds 1-5, fp32 and nf4) for accuracy a CPU
run of the same seeds repeats. Prints what it finds; a mode that fails is reported and skipped.
"""
import json
import subprocess
import sys
import time

import torch

from infmllm_ros.engine.session import SessionConfig, StreamingSession
from infmllm_ros.kernels import use_kernel
from infmllm_ros.synthetic import generate_episode

def run(frames, device, dtype, quantization, kernel):
    """The episode's 20 frames and 5 questions through one session; its answers and last logits."""
    use_kernel(kernel)
    try:
        session = StreamingSession(SessionConfig(device=device, dtype=dtype, quantization=quantization,
                                                 cache_policy="infmllm", cache_budget=96, recent_window=32,
                                                 eviction_chunk=32))
        answers, started = [], time.perf_counter()
        for index, frame in enumerate(frames):
            session.add_frame(frame)
            if index % 4 == 3:
                answers.append(session.ask("how many objects are in view?").text)
        logits = session.add_text("what is in view ?").float().cpu()
        return {"answers": answers, "evictions": session.cache.evictions, "length": session.cache.length,
                "seconds": round(time.perf_counter() - started, 2), "logits": logits,
                "kv_mb": session.cache.nbytes() / 2**20}
    finally:
        use_kernel("auto")


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu check: CUDA is not available (torch %s)" % torch.__version__)
        return 1
    episode = generate_episode(3, 24.0)
    frames = [episode.render(second + 0.5) for second in range(20)]
    cpu = run(frames, "cpu", "float32", "none", "reference")
    print("cpu fp32 reference", {k: v for k, v in cpu.items() if k != "logits"}, flush=True)
    for dtype, quantization in (("float32", "none"), ("bfloat16", "none"), ("bfloat16", "nf4")):
        results = {}
        for kernel in ("reference", "triton"):
            try:
                results[kernel] = run(frames, "cuda", dtype, quantization, kernel)
            except Exception as error:   # report and go on: one broken mode must not hide the others
                print(f"cuda {dtype} {quantization} {kernel}: FAILED {type(error).__name__}: {error}", flush=True)
                continue
            r = results[kernel]
            diff = (r["logits"] - cpu["logits"]).abs().max().item()
            same_top = int(r["logits"].argmax()) == int(cpu["logits"].argmax())
            print(f"cuda {dtype} {quantization} {kernel}:", {k: v for k, v in r.items() if k != "logits"},
                  f"max |logit - cpu| {diff:.4g}, same top token {same_top}", flush=True)
        if len(results) == 2:
            same = results["triton"]["answers"] == results["reference"]["answers"]
            diff = (results["triton"]["logits"] - results["reference"]["logits"]).abs().max().item()
            print(f"cuda {dtype} {quantization}: triton vs reference answers identical {same}, "
                  f"max |logit diff| {diff:.4g}", flush=True)

    for options in (["--device", "cuda", "--quantization", "none"],
                    ["--device", "cuda", "--dtype", "bfloat16", "--quantization", "nf4"]):
        command = [sys.executable, "-m", "infmllm_ros.evaluation", "--policy", "infmllm", "--episodes", "5",
                   "--json", *options]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            print("eval", options, "TIMED OUT after 300 s", flush=True)
            continue
        if done.returncode != 0:
            print("eval", options, "FAILED", done.stderr[-1500:], flush=True)
            continue
        result = json.loads(done.stdout)
        print("eval", options, f"{time.perf_counter() - started:.0f} s", json.dumps(
            {k: result[k] for k in ("accuracy", "correct", "total")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
