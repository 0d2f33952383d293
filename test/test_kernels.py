"""The fused Triton kernel (run by Triton's CPU interpreter here) against the torch reference."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton compiles anything: CPU interpreter

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from infmllm_ros.kernels import attention_with_key_mass_reference, use_kernel  # noqa: E402
from infmllm_ros.kernels.dispatch import is_streaming_causal  # noqa: E402
from infmllm_ros.kernels.triton_attention import attention_with_key_mass_triton  # noqa: E402

SHAPES = [  # (queries in chunk, keys, query heads, kv heads, head dim)
    (1, 1, 2, 2, 16), (1, 37, 4, 4, 16), (1, 129, 4, 2, 64), (1, 61, 8, 2, 32),
    (7, 7, 2, 1, 16), (13, 101, 4, 2, 24), (33, 150, 8, 2, 64), (64, 64, 4, 4, 32), (70, 257, 4, 1, 16),
]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()


@pytest.mark.parametrize("q_len,k_len,q_heads,kv_heads,head_dim", SHAPES)
def test_kernel_matches_reference(q_len, k_len, q_heads, kv_heads, head_dim):
    generator = torch.Generator().manual_seed(hash((q_len, k_len, q_heads, kv_heads, head_dim)) % 2**31)
    query = torch.randn(1, q_heads, q_len, head_dim, generator=generator)
    key = torch.randn(1, kv_heads, k_len, head_dim, generator=generator)
    value = torch.randn(1, kv_heads, k_len, head_dim, generator=generator)
    poisoned_out = torch.full_like(query, float("nan"))
    out, mass = attention_with_key_mass_triton(query, key, value, 0.125, block_m=16, block_n=32,
                                               out=poisoned_out)
    expected_out, expected_mass = attention_with_key_mass_reference(query, key, value, None, 0.125)
    assert not torch.isnan(out).any(), "kernel left output elements unwritten"
    assert relative_error(out, expected_out) <= 1e-3
    assert relative_error(mass, expected_mass) <= 1e-3
    # every query distributes exactly one unit of attention per query head
    assert torch.allclose(mass.sum(-1), torch.full((1, kv_heads), float(q_len * q_heads // kv_heads)), rtol=1e-4)


def test_only_the_streaming_mask_goes_to_the_kernel():
    causal = torch.ones(3, 8, dtype=torch.bool).tril(5)[None, None]
    assert is_streaming_causal(None, 3, 8) and is_streaming_causal(causal, 3, 8)
    padded = causal.clone()
    padded[..., 0] = False
    assert not is_streaming_causal(padded, 3, 8)


def test_engine_tokens_identical_with_kernel_and_reference():
    from infmllm_ros.engine.session import SessionConfig, StreamingSession
    from infmllm_ros.synthetic import generate_episode

    episode = generate_episode(3, 12.0)
    transcripts = {}
    for kernel in ("reference", "triton"):
        use_kernel(kernel)
        try:
            session = StreamingSession(SessionConfig(cache_policy="infmllm", quantization="none", cache_budget=96,
                                                     recent_window=32, eviction_chunk=32))
            answers = []
            for second in range(8):
                session.add_frame(episode.render(second + 0.5))
                if second % 4 == 3:
                    answers.append(session.ask("how many objects are in view?").text)
            transcripts[kernel] = (answers, session.cache.evictions)
        finally:
            use_kernel("auto")
    assert transcripts["triton"] == transcripts["reference"]
    assert transcripts["reference"][1] >= 1, "the comparison must cover evictions"
