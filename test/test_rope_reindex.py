"""Re-indexed cached keys equal keys computed fresh at their new positions, for both RoPE kinds.

Layer 0's pre-rotation keys depend only on each token's own embedding, so they are captured
with a hook on k_proj while streaming. After evictions, the model's own rotary embedding and
`apply_rotary_pos_emb` rotate them to the positions the cache now claims; the cache's keys must
match.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from engine_helpers import frames, session_for


@pytest.mark.parametrize("family", ["llava-llama", "qwen2_vl", "qwen2_5_vl", "idefics3"])
def test_reindexed_keys_equal_fresh_keys(tiny_model_dirs, family):
    _check_reindexed_keys(tiny_model_dirs[family], family)


def test_reindexed_keys_with_attention_factor(tiny_model_dirs, tmp_path):
    """The embedded model ships a YaRN attention factor (cos and sin scaled): a shift must rotate
    the already-scaled keys, not scale them again."""
    import shutil
    from transformers import AutoConfig
    from infmllm_ros.tiny_model.architecture import set_attention_factor
    model_dir = tmp_path / "yarn"
    shutil.copytree(tiny_model_dirs["llava-llama"], model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    set_attention_factor(config.text_config, 1.3)
    config.save_pretrained(model_dir)
    assert AutoConfig.from_pretrained(model_dir).text_config.rope_parameters["attention_factor"] == 1.3
    _check_reindexed_keys(model_dir, "llava-llama")


def _check_reindexed_keys(model_dir, family):
    session = session_for(model_dir, "infmllm", cache_budget=40, recent_window=12,
                          eviction_chunk=24)
    text_model = session.model.get_decoder()
    attention = text_model.layers[0].self_attn
    captured: list[torch.Tensor] = []
    hook = attention.k_proj.register_forward_hook(lambda module, args, out: captured.append(out[0].detach()))
    for image in frames(24, seed=2):
        session.add_frame(image)
    session.ask("what is in view ?")
    hook.remove()
    layer = session.cache.layers[0]
    assert session.cache.evictions >= 3

    pre_rope = torch.cat(captured).view(-1, attention.config.num_key_value_heads, attention.head_dim)  # (T, H, D)
    heads = pre_rope.shape[1]
    modeling = importlib.import_module(type(attention).__module__)
    fresh = []
    for head in range(heads):
        tokens = layer.token_index[head]
        raw = pre_rope[tokens, head][None, None]                                    # (1, 1, L, D)
        positions = layer.positions[head]                                           # (L, 3)
        position_ids = positions[None, :, 0] if positions.shape[0] and family.startswith(("llava", "idefics")) \
            else positions.T[:, None, :]
        cos, sin = text_model.rotary_emb(raw, position_ids)
        _, rotated = modeling.apply_rotary_pos_emb(raw, raw, cos, sin)
        fresh.append(rotated[0, 0])
    fresh = torch.stack(fresh)[None]
    moved = (layer.positions[..., 0] != layer.token_index + 0).any()
    assert moved or family.startswith("qwen"), "eviction must have moved tokens for this test to mean anything"
    assert torch.max(torch.abs(layer.keys - fresh)).item() < 1e-5


def test_frame_grid_survives_reindexing(tiny_model_dirs):
    """M-RoPE: the visual tokens of one frame keep their (t, h, w) offsets after re-indexing."""
    session = session_for(tiny_model_dirs["qwen2_vl"], "streaming", cache_budget=40, eviction_chunk=24)
    for image in frames(10, seed=4):
        session.add_frame(image)
    layer = session.cache.layers[0]
    assert session.cache.evictions >= 2
    for head in range(layer.positions.shape[0]):
        segments = layer.segments[head]
        for segment in segments.unique():
            members = layer.positions[head][segments == segment]
            if members.shape[0] == 4:  # one whole 2x2 frame grid
                offsets = members - members[0]
                assert offsets.tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]]
