"""Text-stream suite: perplexity over position on a narration of a million tokens and more.

The StreamingLLM experiment on the embedded model's language model: `full` (until its cost grows
too large, and past the 2,048 positions it was trained on), a plain sliding window that evicts the
first tokens, the same window with 4 attention sinks (`streaming`) and `infmllm`. Tokens are fed in
chunks of the eviction size, each scored against the cache as it then is (no recomputation).

Only answer tokens (after "<a>", up to and including "</s>") are scored: the embedded model was
trained with loss on answers alone, so its question-token predictions carry no meaning. Answers
depend on frames this text-only stream lacks, so the floor is about the number of valid answers
per question (~4-6); what matters is the shape over position.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from tqdm import tqdm

from infmllm_ros.synthetic.narration import narration_ids

from .measure import make_session

VARIANTS: dict[str, tuple[str, dict]] = {
    "full": ("full", {}),
    "window (no sinks)": ("streaming", {"sink_tokens": 0}),
    "streaming": ("streaming", {"sink_tokens": 4}),
    "infmllm": ("infmllm", {}),
}


def position_bins(total: int) -> list[int]:
    """Bin edges 0, 256, 512, 1k, ... doubling up to `total`."""
    edges = [0, 256]
    while edges[-1] < total:
        edges.append(min(edges[-1] * 2, total))
    return edges


def stream_nll(session, ids: list[int], label: str) -> torch.Tensor:
    """Negative log-likelihood of every token after the first, fed chunk by chunk."""
    chunk = session.policy.chunk
    nll = torch.empty(len(ids) - 1)
    previous = None
    for start in tqdm(range(0, len(ids), chunk), desc=f"text {label}", unit="chunk", leave=False):
        piece = torch.tensor(ids[start:start + chunk])
        logits = session.score_tokens(piece).float()
        log_probs = F.log_softmax(logits, dim=-1)
        if previous is not None:
            nll[start - 1] = -previous[piece[0]]
        inner = -log_probs[:-1].gather(1, piece[1:, None]).squeeze(1)
        nll[start:start + inner.numel()] = inner
        previous = log_probs[-1]
    return nll


def answer_mask(ids: list[int], answer_start: int, answer_end: int) -> torch.Tensor:
    """True at the positions of answer tokens: after `answer_start`, up to and including `answer_end`."""
    mask, inside = torch.zeros(len(ids), dtype=torch.bool), False
    for k, token in enumerate(ids):
        mask[k] = inside
        if token == answer_start:
            inside = True
        elif token == answer_end:
            inside = False
    return mask


def run_text(model_path, total_tokens: int, budget: int, recent: int, full_max_tokens: int,
             variants=tuple(VARIANTS), chunk: int = 256) -> list[dict]:
    """Rows of {variant, from, to, ppl, cache_tokens} per position bin (nll[i] scores token i + 1)."""
    rows = []
    for label in tqdm(variants, desc="text variants", unit="variant"):
        policy, overrides = VARIANTS[label]
        # Chunks of 256: 2.5x faster than 64 over a million tokens, and each is still scored causally.
        session = make_session(model_path, policy, budget, recent, eviction_chunk=chunk, **overrides)
        length = min(total_tokens, full_max_tokens) if policy == "full" else total_tokens
        ids = list(itertools.islice(narration_ids(session.tokenizer), length))
        nll = stream_nll(session, ids, label)
        scored = answer_mask(ids, session.tokenizer.convert_tokens_to_ids("<a>"), session.tokenizer.eos_token_id)[1:]
        edges = position_bins(length)
        for low, high in zip(edges, edges[1:]):
            part = nll[low:high][scored[low:high]]
            if part.numel():
                rows.append({"variant": label, "from": low, "to": high, "ppl": math.exp(part.mean().item()),
                             "cache_tokens": session.cache_tokens})
    return rows
