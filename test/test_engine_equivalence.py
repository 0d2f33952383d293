"""With a budget larger than the context, every policy reproduces plain transformers exactly.

The reference is one ordinary forward over the whole stream written as a single prompt (all
frames and the question) with a DynamicCache, positions computed by the model itself. The
session instead appends frame by frame and chunk by chunk into its bounded cache, through SDPA
or the scoring attention depending on the policy.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from transformers import DynamicCache

from engine_helpers import FAMILIES, frames, session_for

POLICIES = ("full", "streaming", "h2o", "infmllm")
QUESTION = "what is in the view ?"


def reference_logits(session, images) -> torch.Tensor:
    prompt = session.prompt.frame * len(images) + session.prompt.question.format(question=QUESTION)
    inputs = session.processor(text=prompt, images=[Image.fromarray(i) for i in images], return_tensors="pt")
    with torch.inference_mode():
        output = session.model(**inputs, cache=DynamicCache(config=session.model.config), use_cache=True)
    return output.logits[0, -1]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_matches_plain_forward_when_budget_exceeds_context(tiny_model_dirs, family, policy):
    images = frames(5, seed=1)
    session = session_for(tiny_model_dirs[family], policy, cache_budget=4096, recent_window=64,
                          eviction_chunk=256)
    for index, image in enumerate(images):
        session.add_frame(image, stamp=float(index))
    logits = session.add_text(session.prompt.question.format(question=QUESTION))
    assert session.cache.evictions == 0
    expected = reference_logits(session, images)
    assert torch.max(torch.abs(logits - expected)).item() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_round_answers_stay_in_cache(tiny_model_dirs, family):
    """Frames, a question, its answer, more frames, another question: one cache, no recompute."""
    session = session_for(tiny_model_dirs[family], "infmllm")
    forwarded = []   # tokens the language model is given, call by call
    session.model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: forwarded.append(kwargs["inputs_embeds"].shape[1]), with_kwargs=True)
    for image in frames(3):
        session.add_frame(image)
    first = session.ask(QUESTION)
    after_first, forwarded_first = session.cache.tokens_seen, sum(forwarded)
    assert forwarded_first == after_first
    for image in frames(2, seed=3):
        session.add_frame(image)
    second = session.ask(QUESTION)
    assert first.tokens >= 1 and second.tokens >= 1
    assert second.frames_seen == 5
    # the second round forwarded only its new tokens (frames, question, answer), never the first again
    assert sum(forwarded) - forwarded_first == session.cache.tokens_seen - after_first > 0
    assert second.ttft_s <= second.total_s
