"""Retrieval supervision (tiny_model/retrieval.py): the probe sees the attention the model really
computes, the evidence it is pointed at is the frames that show the object asked about (or, with
object evidence, that object's own patches), and the loss moves attention there."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from infmllm_ros.synthetic import COLOURS, SHAPES, corpus_text
from infmllm_ros.tiny_model.architecture import IMAGE_TOKENS, build_model, train_tokenizer
from infmllm_ros.tiny_model.data import SequenceWriter, Window, build_sequence
from infmllm_ros.tiny_model.evidence import asked_object
from infmllm_ros.tiny_model.features import input_embeddings, language_model_loss
from infmllm_ros.tiny_model.retrieval import (Probe, best_head_mass, probing, retrieval_layers, retrieval_loss,
                                              use_probe_attention)
from infmllm_ros.tiny_model.vision_pretraining import patch_targets

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


def test_object_evidence_is_the_asked_objects_patches():
    tokenizer, _ = _model()
    colour, shape = list(COLOURS).index, SHAPES.index
    # written by hand, in camera pixels (640x480, 4x4 patches of 160x120): a green cross in the top
    # left patch reaching into the one below, a blue circle across the four bottom-right ones
    scene = [(colour("green"), shape("cross"), 100.0, 100.0, 60.0),
             (colour("blue"), shape("circle"), 500.0, 380.0, 60.0)]
    writer = SequenceWriter(tokenizer, object_evidence=True)
    for t in 0.5 + np.arange(3):
        writer.frame(t=float(t), objects=scene if t > 1 else None)   # the first frame shows them in part
    last = 1 + 2 * (IMAGE_TOKENS + 1)
    for text, answer in (("what colour is the cross?", "green"), ("what shape is the blue object?", "circle")):
        writer.question(text, answer, "current")
    writer.question("what colour was the cross seen earlier?", "green", "long", evidence=(0.0, 2.0))
    writer.question("how many objects are in view?", "two", "current")
    second = 1 + IMAGE_TOKENS + 1
    assert writer.retrieval_evidence == [[last, last + 4], [last + 10, last + 11, last + 14, last + 15],
                                        [second, second + 4]]
    assert writer.retrieval_families == ["current", "current", "long"]
    # a span whose frames show the object only in part: the whole frames, as without object evidence
    writer.question("what colour was the cross seen earlier?", "green", "long", evidence=(0.0, 1.0))
    assert writer.retrieval_evidence[-1] == list(range(1, 1 + IMAGE_TOKENS))
    # on a rendered stream: every evidence patch is labelled, for the vision stage, with the asked
    # object's colour or shape, and current-scene questions are supervised too
    stream = labelled_stream(duration=60.0)
    batch = build_sequence(stream, Window([(0, len(stream.frame_times))]), tokenizer, side_questions=24,
                           rng=random.Random(1), object_evidence=True)
    ids, image = batch["input_ids"][0].tolist(), tokenizer.convert_tokens_to_ids("<image>")
    ask = tokenizer.convert_tokens_to_ids("<q>")
    frame_of = {}
    for index, start in enumerate(i for i in range(1, len(ids)) if ids[i] == image and ids[i - 1] != image
                                  and batch["branches"][0][i] < 0):
        frame_of.update({start + patch: (index, patch) for patch in range(IMAGE_TOKENS)})
    assert "current" in batch["retrieval_families"] and len(batch["retrieval_rows"]) >= 10
    checked = 0
    for row, tokens in zip(batch["retrieval_rows"], batch["retrieval_evidence"]):
        question = tokenizer.decode(ids[max(i for i in range(row) if ids[i] == ask):row])
        answer = tokenizer.decode(ids[row + 1:ids.index(tokenizer.eos_token_id, row)])
        about = asked_object(question, answer)
        assert about is not None and all(t in frame_of for t in tokens)
        for token in tokens:
            index, patch = frame_of[token]
            if stream.objects[index] is not None:
                labels = patch_targets(stream.objects[index])
                assert labels[0][patch] == about[0] + 1 or labels[1][patch] == about[1] + 1
                checked += 1
    assert checked > 50


def test_one_head_per_layer_must_look_at_every_rows_evidence():
    """Two heads that each sit on one of two objects, whatever the question, do not satisfy the
    loss: each question's evidence must be where one head of the layer looks."""
    evidence = [[0], [1]]
    split = torch.tensor([[[0.9, 0.1], [0.9, 0.1]],      # head 0: always object 0
                          [[0.1, 0.9], [0.1, 0.9]]])     # head 1: always object 1
    keyed = torch.tensor([[[0.9, 0.1], [0.1, 0.9]],      # head 0: the object each question asks about
                          [[0.5, 0.5], [0.5, 0.5]]])
    losses = {}
    for name, weights in (("split", split), ("keyed", keyed)):
        probe = Probe(torch.tensor([0, 1]), frozenset({1}), {1: weights})
        losses[name] = float(retrieval_loss(probe, evidence))
        assert torch.allclose(best_head_mass(probe, evidence), torch.tensor([0.9, 0.9 if name == "keyed" else 0.1]))
    assert losses["keyed"] == pytest.approx(-np.log(0.9), abs=1e-4) and losses["split"] > 1.0


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
