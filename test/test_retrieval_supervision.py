"""Retrieval supervision (tiny_model/retrieval.py): the probe sees the attention the model really
computes, the evidence it is pointed at is the frames that show the object asked about, and the
loss moves attention there."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from infmllm_ros.synthetic import corpus_text
from infmllm_ros.tiny_model.architecture import IMAGE_TOKENS, build_model, train_tokenizer
from infmllm_ros.tiny_model.data import SequenceWriter, Window, build_sequence
from infmllm_ros.tiny_model.features import input_embeddings, language_model_loss
from infmllm_ros.tiny_model.retrieval import best_head_mass, probing, retrieval_layers, use_probe_attention

from test_side_questions import labelled_stream


def _model(layers: int = 3):
    torch.manual_seed(0)
    tokenizer = train_tokenizer(corpus_text(range(5)))
    return tokenizer, build_model(tokenizer, 128, 1, layers)


def test_evidence_is_the_image_tokens_of_the_frames_that_show_the_object():
    tokenizer, _ = _model()
    stream = labelled_stream(duration=60.0)
    batch = build_sequence(stream, Window([(0, len(stream.frame_times))]), tokenizer, side_questions=24,
                           rng=random.Random(1))
    ids = batch["input_ids"][0]
    answer_start = tokenizer.convert_tokens_to_ids("<a>")
    image = tokenizer.convert_tokens_to_ids("<image>")
    assert len(batch["retrieval_rows"]) >= 10
    assert set(batch["retrieval_families"]) <= {"recent", "long", "distant"}
    # token positions of each frame's first image token, in stream order
    frame_starts = [i for i in range(1, len(ids)) if ids[i] == image and ids[i - 1] != image]
    frame_starts = [i for i in frame_starts if batch["branches"][0][i] < 0]
    assert len(frame_starts) == len(stream.frame_times)
    for row, tokens in zip(batch["retrieval_rows"], batch["retrieval_evidence"]):
        assert int(ids[row]) == answer_start and all(t < row for t in tokens)
        assert bool((ids[tokens] == image).all()) and len(tokens) % IMAGE_TOKENS == 0
        shown = {frame_starts.index(t) for t in tokens[::IMAGE_TOKENS]}
        assert shown and all(0 <= index < len(stream.frame_times) for index in shown)
    # written by hand: frames at 0.5 .. 5.5 s, an object on screen from 1.2 s to 3.9 s
    writer = SequenceWriter(tokenizer)
    for t in 0.5 + np.arange(6):
        writer.frame(t=float(t))
    writer.question("what colour was the cross seen earlier?", "red", "long", evidence=(1.2, 3.9))
    image_of_frame = [1 + frame * (IMAGE_TOKENS + 1) for frame in range(6)]   # "<frame>" then its image tokens
    assert writer.retrieval_evidence == [[image_of_frame[f] + k for f in (1, 2, 3) for k in range(IMAGE_TOKENS)]]
    assert writer.ids[writer.retrieval_rows[0]] == answer_start and writer.retrieval_families == ["long"]
    writer.question("what colour is the cross?", "red", "current")   # no evidence span: not supervised
    assert len(writer.retrieval_rows) == 1


@pytest.mark.parametrize("side_questions", [12, 0])   # a branch mask, and plain causal (no mask given)
def test_the_probe_sees_the_attention_the_model_computes(side_questions):
    tokenizer, model = _model()
    stream = labelled_stream(duration=30.0)
    batch = build_sequence(stream, Window([(0, 30)]), tokenizer, side_questions=side_questions,
                           rng=random.Random(2))
    rows = batch["retrieval_rows"]
    assert rows and ("attention_mask" in batch) == bool(side_questions)
    embeds = input_embeddings(model, batch["input_ids"], batch["features"])
    model.eval().set_attn_implementation({"text_config": "eager", "vision_config": "sdpa"})
    with torch.inference_mode():
        eager = model(inputs_embeds=embeds, position_ids=batch["position_ids"],
                      attention_mask=batch.get("attention_mask"), output_attentions=True).attentions
    use_probe_attention(model)
    with torch.inference_mode(), probing(rows, range(3)) as probe:
        probed = model(inputs_embeds=embeds, position_ids=batch["position_ids"],
                       attention_mask=batch.get("attention_mask"))
    for layer in range(3):
        assert torch.allclose(probe.weights[layer], eager[layer][0][:, rows], atol=1e-5)
    assert torch.isfinite(probed.logits).all()
    assert retrieval_layers(model) == range(1, 2) and retrieval_layers(_model(1)[1]) == range(0, 1)


def test_the_retrieval_loss_raises_attention_on_the_evidence():
    tokenizer, model = _model()
    use_probe_attention(model)
    stream = labelled_stream(duration=30.0)
    batch = build_sequence(stream, Window([(0, 30)]), tokenizer, side_questions=12, rng=random.Random(2))

    def mass() -> float:
        with torch.inference_mode(), probing(batch["retrieval_rows"], retrieval_layers(model)) as probe:
            model(inputs_embeds=input_embeddings(model, batch["input_ids"], batch["features"]),
                  position_ids=batch["position_ids"], attention_mask=batch["attention_mask"])
        return float(best_head_mass(probe, batch["retrieval_evidence"]).mean())

    before = mass()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(5):
        total = language_model_loss(model, batch, retrieval_weight=1.0)
        with torch.no_grad():
            assert total.item() > language_model_loss(model, batch).item()   # the retrieval term is in the loss
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    assert mass() > before + 0.02
