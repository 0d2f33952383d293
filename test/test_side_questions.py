"""Side questions: each sees the stream up to its frame and is seen by nothing after it."""

from __future__ import annotations

import random

import numpy as np
import torch

from infmllm_ros.synthetic import corpus_text, generate_episode, generate_questions
from infmllm_ros.synthetic.questions import Question
from infmllm_ros.tiny_model.architecture import IMAGE_TOKENS, build_model, train_tokenizer
from infmllm_ros.tiny_model.data import Window, build_sequence, kind_balanced_sample, side_candidates
from infmllm_ros.tiny_model.features import language_model_loss
from infmllm_ros.tiny_model.streams import RenderedStream, frame_objects


def labelled_stream(seed: int = 130_011, duration: float = 40.0) -> RenderedStream:
    """A short training stream with random frame features (what the language-model tests need)."""
    episode = generate_episode(seed, duration)
    times = 0.5 + np.arange(int(duration))
    stream = RenderedStream(seed, times, [frame_objects(episode, float(t)) for t in times],
                            generate_questions(episode, seed, spacing_s=1.0))
    stream.features = torch.randn(len(times), IMAGE_TOKENS, 128, generator=torch.Generator().manual_seed(0)).half()
    return stream


def test_side_questions_are_true_and_leave_the_stream_unchanged():
    torch.manual_seed(0)
    tokenizer = train_tokenizer(corpus_text(range(5)))
    model = build_model(tokenizer, 128, 1).eval()
    stream = labelled_stream()
    window = Window([(0, len(stream.frame_times))])
    plain = build_sequence(stream, window, tokenizer)
    sided = build_sequence(stream, window, tokenizer, side_questions=24, rng=random.Random(1))
    assert len(sided["side_families"]) >= 10 and sided["families"] == plain["families"]
    assert bool((sided["attention_mask"][0, 0].diagonal() == 0).all())   # every token sees itself
    with torch.inference_mode():
        plain_logits = language_model_loss(model, plain, logits=True)[0]
        sided_logits = language_model_loss(model, sided, logits=True)[0]
    # the stream's tokens (those whose positions are not repeated by a branch) give the same
    # logits with and without the branches: nothing in the stream sees a side question
    is_stream = sided["branches"][0] < 0
    kept = sided["input_ids"][0][is_stream]
    assert torch.equal(kept, plain["input_ids"][0])
    assert torch.allclose(sided_logits[is_stream], plain_logits, atol=1e-4)
    # every side answer is what the world says at its time
    for frame_questions in side_candidates(stream):
        for question in frame_questions:
            assert question.answer in tokenizer.get_vocab() or " " in question.answer


def test_a_side_question_is_answered_as_if_asked_alone_after_its_frame():
    torch.manual_seed(0)
    tokenizer = train_tokenizer(corpus_text(range(5)))
    model = build_model(tokenizer, 128, 1).eval()
    stream = labelled_stream()
    stream.questions = []   # only the side question, so the alone-sequence is easy to write
    window = Window([(0, 20)])
    sided = build_sequence(stream, window, tokenizer, side_questions=4, rng=random.Random(3))
    branches = sided["branches"][0]
    ids, positions = sided["input_ids"][0], sided["position_ids"][0]
    first = int((branches == 0).nonzero()[0])
    end = int((branches == 0).nonzero()[-1]) + 1
    alone = {"input_ids": ids[None, :end], "position_ids": positions[None, :end],
             "features": stream.features[:int((ids[:first] == model.config.image_token_index).sum()) // IMAGE_TOKENS]}
    assert int(positions[first]) == int(positions[first - 1]) + 1   # it continues the stream's positions
    with torch.inference_mode():
        both = language_model_loss(model, sided, logits=True)[0]
        single = language_model_loss(model, alone, logits=True)[0]
    assert torch.allclose(both[first:end], single[first:end], atol=1e-4)


def test_balanced_kinds_take_turns_while_a_kind_has_candidates():
    """--balance-kinds: a kind with a third of the candidates is drawn as often as the other, until
    it runs out; without it, draws follow the candidates' shares."""
    def option(kind: str, number: int):
        return (number, Question(t=float(number), family="distant", text=kind, answer="red", kind=kind))

    options = [option("shape_of_colour_distant", n) for n in range(300)] + [
        option("colour_of_shape_distant", n) for n in range(100)]
    picked = kind_balanced_sample(options, 100, random.Random(0))
    kinds = [question.kind for _, question in picked]
    assert len(picked) == 100 and len(set(map(id, picked))) == 100
    assert kinds.count("colour_of_shape_distant") == 50
    few = options[:300] + options[300:310]
    kinds = [question.kind for _, question in kind_balanced_sample(few, 100, random.Random(0))]
    assert kinds.count("colour_of_shape_distant") == 10 and len(kinds) == 100
    plain = [q.kind for _, q in random.Random(0).sample(options, 100)]
    assert plain.count("colour_of_shape_distant") < 40


def test_balanced_side_questions_are_the_same_questions_in_other_shares():
    tokenizer = train_tokenizer(corpus_text(range(5)))
    stream = labelled_stream()
    window = Window([(0, len(stream.frame_times))])
    sided = build_sequence(stream, window, tokenizer, side_questions=24, rng=random.Random(1), balance_kinds=True)
    plain = build_sequence(stream, window, tokenizer, side_questions=24, rng=random.Random(1))
    assert sided["families"] == plain["families"] and len(sided["side_families"]) >= 10


def test_a_side_kinds_drill_asks_only_those_kinds_and_as_many_as_asked():
    """--side-kinds: every side question of the named kinds, up to the count, none of any other."""
    from infmllm_ros.tiny_model.data import _pick_side_questions
    stream = labelled_stream()
    window = Window([(0, len(stream.frame_times))])
    shown = stream.frame_times[window.frames]
    available = sum(q.kind == "colour_of_shape" for index in window.frames for q in side_candidates(stream)[index])
    assert available > 6
    drilled = _pick_side_questions(stream, window, shown, 6, random.Random(1), kinds=frozenset({"colour_of_shape"}))
    asked = [question for questions in drilled.values() for question in questions]
    assert len(asked) == 6 and {question.kind for question in asked} == {"colour_of_shape"}
    everything = _pick_side_questions(stream, window, shown, 1000, random.Random(1),
                                      kinds=frozenset({"colour_of_shape"}))
    assert sum(map(len, everything.values())) == available
    mixed = _pick_side_questions(stream, window, shown, 24, random.Random(1))
    assert len({question.kind for questions in mixed.values() for question in questions}) > 1
