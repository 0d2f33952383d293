"""GPU check and timing of the fused kernel (run on a CUDA machine: `python -m infmllm_ros.kernels.bench_gpu`).

1. Correctness against the torch reference (fp32 and bf16) at several shapes.
2. Time per call at cache lengths 4k-128k, decode (1 query) and a 64-token chunk, grouped-query
   heads of a 7B-class model (32 query heads, 8 KV heads, head dim 128), bf16:
   the fused kernel vs SDPA plus a separate scoring pass (what H2O-style code does without it).
Prints the table last.
"""

from __future__ import annotations

import sys

import torch

from .reference import attention_with_key_mass_reference


def scoring_pass(query, key, scaling):
    """The unfused baseline's extra pass: attention probabilities again, summed per key."""
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    q_len, k_len = query.shape[2], key.shape[2]
    logits = (query @ k.transpose(-1, -2)).float() * scaling
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    return probs.sum(2).view(key.shape[0], key.shape[1], groups, k_len).sum(2)


def sdpa(query, key, value, scaling):
    q_len, k_len = query.shape[2], key.shape[2]
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=causal, scale=scaling,
                                                            enable_gqa=True)


def time_ms(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this script is for a GPU machine")
        return 1
    from .triton_attention import attention_with_key_mass_triton
    device = "cuda"
    print(f"device: {torch.cuda.get_device_name()}")
    worst = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        for q_len, k_len, hq, hkv, d in [(1, 4099, 32, 8, 128), (64, 8192, 32, 8, 128), (17, 1000, 8, 2, 64)]:
            q = torch.randn(1, hq, q_len, d, device=device, dtype=dtype)
            k = torch.randn(1, hkv, k_len, d, device=device, dtype=dtype)
            v = torch.randn(1, hkv, k_len, d, device=device, dtype=dtype)
            out, mass = attention_with_key_mass_triton(q, k, v, d ** -0.5)
            ref_out, ref_mass = attention_with_key_mass_reference(q.float(), k.float(), v.float(), None, d ** -0.5)
            error = max(((out.float() - ref_out).abs().max() / ref_out.abs().max()).item(),
                        ((mass - ref_mass).abs().max() / ref_mass.abs().max()).item())
            worst = max(worst, error) if dtype == torch.float32 else worst
            print(f"check {str(dtype):15s} q={q_len:3d} k={k_len:6d}: max relative error {error:.2e}")
    rows = []
    hq, hkv, d = 32, 8, 128
    for k_len in (4096, 16384, 65536, 131072):
        for q_len in (1, 64):
            q = torch.randn(1, hq, q_len, d, device=device, dtype=torch.bfloat16)
            k = torch.randn(1, hkv, k_len, d, device=device, dtype=torch.bfloat16)
            v = torch.randn(1, hkv, k_len, d, device=device, dtype=torch.bfloat16)
            fused = time_ms(lambda: attention_with_key_mass_triton(q, k, v, d ** -0.5))
            unfused = time_ms(lambda: (sdpa(q, k, v, d ** -0.5), scoring_pass(q, k, d ** -0.5)))
            plain = time_ms(lambda: sdpa(q, k, v, d ** -0.5))
            rows.append((k_len, q_len, fused, unfused, plain))
    print("\n| cache tokens | queries | fused ms | SDPA + scoring pass ms | SDPA alone ms | speedup |")
    print("|---|---|---|---|---|---|")
    for k_len, q_len, fused, unfused, plain in rows:
        print(f"| {k_len} | {q_len} | {fused:.3f} | {unfused:.3f} | {plain:.3f} | {unfused / fused:.2f}x |")
    print(f"\nfp32 worst relative error {worst:.2e} ({'ok' if worst <= 1e-3 else 'FAILED'})")
    return 0 if worst <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
