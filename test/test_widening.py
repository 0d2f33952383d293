"""Widening a trained language model (tiny_model/widening.py) changes nothing it computes."""

import pytest
import torch

from infmllm_ros.synthetic import corpus_text
from infmllm_ros.tiny_model.architecture import build_model, train_tokenizer
from infmllm_ros.tiny_model.widening import widen_into


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus_text(range(5)))


def _logits(model, tokens):
    with torch.no_grad():
        return model.model.language_model(input_ids=tokens).last_hidden_state @ model.lm_head.weight.T


def test_a_wider_model_gives_the_trained_models_logits_and_its_new_parts_learn(tokenizer):
    torch.manual_seed(0)
    narrow = build_model(tokenizer, vision_layers=1, language_layers=2).eval()
    for parameter in narrow.parameters():          # not the fresh init: every trained weight matters
        parameter.data.normal_(0, 0.1)
    wide = build_model(tokenizer, vision_layers=1, language_layers=2, language_heads=8, language_kv_heads=4,
                       language_intermediate=768).eval()
    grown = widen_into(narrow, wide)
    assert {name.rsplit(".", 2)[-2] for name in grown} == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"}
    tokens = torch.randint(0, len(tokenizer), (1, 40))
    torch.testing.assert_close(_logits(wide, tokens), _logits(narrow, tokens), atol=1e-5, rtol=1e-5)
    layer = wide.model.language_model.layers[0]
    assert layer.self_attn.q_proj.weight.shape == (512, 256) and layer.mlp.down_proj.weight.shape == (256, 768)
    assert layer.self_attn.o_proj.weight[:, 256:].abs().sum() == 0 < layer.self_attn.q_proj.weight[256:].abs().sum()

    wide.train()
    hidden = wide.model.language_model(input_ids=tokens).last_hidden_state
    (hidden @ wide.lm_head.weight.T).logsumexp(-1).mean().backward()
    assert layer.self_attn.o_proj.weight.grad[:, 256:].abs().sum() > 0, "the silent heads' outputs get a gradient"
    assert layer.mlp.down_proj.weight.grad[:, 512:].abs().sum() > 0


def test_what_cannot_grow_is_refused(tokenizer):
    narrow = build_model(tokenizer, vision_layers=1, language_layers=2)
    deeper = build_model(tokenizer, vision_layers=1, language_layers=3)
    with pytest.raises(ValueError, match="differ"):
        widen_into(narrow, deeper)
    narrower = build_model(tokenizer, vision_layers=1, language_layers=2, language_intermediate=256)
    with pytest.raises(ValueError, match="does not fit"):
        widen_into(narrow, narrower)
    wider_tower = build_model(tokenizer, vision_width=256, vision_layers=1, language_layers=2)
    with pytest.raises(ValueError, match="only the language model"):
        widen_into(narrow, wider_tower)
    regrouped = build_model(tokenizer, vision_layers=1, language_layers=2, language_heads=8, language_kv_heads=2)
    with pytest.raises(ValueError, match="per KV head"):
        widen_into(narrow, regrouped)
