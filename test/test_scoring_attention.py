"""The scoring attention gives SDPA's output and exactly the attention mass eager attention implies."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from transformers import DynamicCache

from engine_helpers import frames, session_for
from infmllm_ros.kernels import attention_with_key_mass_reference


def test_collected_mass_equals_column_sums_of_eager_attention(tiny_model_dirs):
    session = session_for(tiny_model_dirs["llava-llama"], "h2o", cache_budget=4096, eviction_chunk=256)
    images = frames(3)
    for image in images:
        session.add_frame(image)
    prompt = session.prompt.frame * len(images)
    inputs = session.processor(text=prompt, images=[Image.fromarray(i) for i in images], return_tensors="pt")
    session.model.set_attn_implementation({"text_config": "eager", "vision_config": "sdpa"})
    with torch.inference_mode():
        output = session.model(**inputs, cache=DynamicCache(config=session.model.config), output_attentions=True)
    groups = session.model.config.get_text_config().num_attention_heads // 2
    for layer, attention in zip(session.cache.layers, output.attentions):
        # eager: (1, Hq, q, k). Summed over queries and over the query heads of each KV head.
        expected = attention[0].sum(dim=1).view(2, groups, -1).sum(dim=1)
        assert torch.allclose(layer.attention_mass, expected, atol=1e-5)


@pytest.mark.parametrize("q_len,k_len,q_heads,kv_heads", [(1, 9, 4, 4), (5, 5, 4, 2), (7, 130, 8, 2), (70, 83, 2, 1)])
def test_reference_matches_sdpa_and_naive_mass(q_len, k_len, q_heads, kv_heads):
    generator = torch.Generator().manual_seed(q_len * 1000 + k_len)
    query = torch.randn(1, q_heads, q_len, 16, generator=generator)
    key = torch.randn(1, kv_heads, k_len, 16, generator=generator)
    value = torch.randn(1, kv_heads, k_len, 16, generator=generator)
    out, mass = attention_with_key_mass_reference(query, key, value, None, 0.25, query_block=32)
    repeat = q_heads // kv_heads
    full_key, full_value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    expected = torch.nn.functional.scaled_dot_product_attention(query, full_key, full_value, attn_mask=causal, scale=0.25)
    assert torch.allclose(out, expected.transpose(1, 2), atol=1e-5)
    probs = torch.softmax((query @ full_key.transpose(-1, -2) * 0.25).masked_fill(~causal, float("-inf")), -1)
    assert torch.allclose(mass[0], probs[0].sum(1).view(kv_heads, repeat, k_len).sum(1), atol=1e-5)


def test_reference_with_explicit_masks_and_no_queries():
    """An all-true mask (what a decoded token gets) gives the unmasked result; a fully masked row
    attends nowhere (zero output, no mass); no queries give empty output and zero mass."""
    generator = torch.Generator().manual_seed(7)
    query = torch.randn(1, 4, 3, 16, generator=generator)
    key, value = torch.randn(1, 2, 11, 16, generator=generator), torch.randn(1, 2, 11, 16, generator=generator)
    everything = torch.ones(1, 1, 1, 11, dtype=torch.bool)
    out, mass = attention_with_key_mass_reference(query[:, :, -1:], key, value, everything, 0.25)
    plain_out, plain_mass = attention_with_key_mass_reference(query[:, :, -1:], key, value, None, 0.25)
    assert torch.equal(out, plain_out) and torch.equal(mass, plain_mass)
    mask = torch.ones(1, 1, 3, 11, dtype=torch.bool)
    mask[0, 0, 1] = False                                   # the second query may see nothing
    mask[0, 0, 2, 5:] = False
    out, mass = attention_with_key_mass_reference(query, key, value, mask, 0.25, query_block=2)
    assert torch.all(out[0, 1] == 0) and torch.isfinite(out).all()
    assert torch.allclose(mass.sum(-1), torch.full((1, 2), 2.0 * 2), atol=1e-5), "two queries x two heads per group"
    first_out, first_mass = attention_with_key_mass_reference(query[:, :, :1], key, value, everything, 0.25)
    assert torch.allclose(mass[..., 5:], first_mass[..., 5:], atol=1e-6), "keys 5+: only the first query saw them"
    empty_out, empty_mass = attention_with_key_mass_reference(query[:, :, :0], key, value, None, 0.25)
    assert empty_out.shape == (1, 0, 4, 16) and empty_mass.shape == (1, 2, 11) and not empty_mass.any()
