"""Retrieval supervision: teach attention where a memory question's evidence lies.

The embedded model reads an old object well once the stream is cut down to it (infmllm-eval
--cut-to-evidence), yet on a whole 10-minute stream it loses that object among the minutes of
other objects. Answer loss alone tells attention only indirectly where to look. Training data
knows exactly which frames show the object a question asks about, so a second loss can say it
directly: at the token that predicts a memory answer, some head in each upper layer should put
its attention on those frames' image tokens. The loss is -log(mass) of one head per layer (the
one that looks best over the sequence's questions), so one head per layer may specialise in
looking back while the others keep their jobs. Measured
on the weights shipped then (G) at the answer token, over a whole 600 s stream: best-head mass on the
evidence of recent/long questions 0.55-0.97 in layers 1-3 but 0.03-0.26 for distant ones (0.02
would be uniform); on a window with a fifth of the minutes between, distant reached 0.48.

Attention probabilities are not returned by SDPA, so a registered attention function runs the
usual SDPA and, for the few probed rows only, recomputes their softmax (rows x keys, not keys x
keys): a small cost beside the step.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

ATTENTION_NAME = "sdpa_retrieval_probe"
_EPSILON = 1e-6


@dataclass
class Probe:
    """Rows (query positions) whose attention to keep, per probed layer."""

    rows: torch.Tensor
    layers: frozenset[int]
    weights: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> (heads, rows, keys)


_active: Probe | None = None


def _probed_sdpa(module, query, key, value, attention_mask, **kwargs):
    output = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    probe, layer = _active, getattr(module, "layer_idx", None)
    if probe is not None and layer in probe.layers:
        keys = repeat_kv(key, query.shape[1] // key.shape[1])[0]           # (heads, n, d)
        rows = query[0][:, probe.rows.to(query.device)]                       # (heads, r, d)
        logits = rows @ keys.transpose(-1, -2) * kwargs.get("scaling", module.scaling)
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask[0, :, probe.rows.to(attention_mask.device), : keys.shape[1]]
            logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
        else:   # plain causal: a row sees keys up to itself
            rows_at = probe.rows.to(logits.device)
            later = torch.arange(keys.shape[1], device=logits.device).unsqueeze(0) > rows_at.unsqueeze(1)
            logits = logits.masked_fill(later, float("-inf"))
        probe.weights[layer] = logits.float().softmax(-1)
    return output


AttentionInterface.register(ATTENTION_NAME, _probed_sdpa)


def use_probe_attention(model) -> None:
    """The language model's attention becomes SDPA plus the probe (a no-op when none is active)."""
    model.set_attn_implementation({"text_config": ATTENTION_NAME, "vision_config": "sdpa"})


@contextmanager
def probing(rows: list[int], layers: range):
    global _active
    _active = Probe(torch.tensor(rows, dtype=torch.long), frozenset(layers))
    try:
        yield _active
    finally:
        _active = None


def retrieval_layers(model) -> range:
    """The layers supervised: where the model already looks back on its own (layers 1-3 of 6
    hold most attention on the evidence of the questions it answers well; layer 0 has not read
    the question yet, the top layers do other work)."""
    count = model.config.text_config.num_hidden_layers
    start = 1 if count > 1 else 0
    return range(start, max(start + 1, count * 2 // 3))


def _evidence_mass(weights: torch.Tensor, evidence: list[list[int]]) -> torch.Tensor:
    """(heads, rows): each head's attention mass on each row's evidence tokens."""
    return torch.stack([weights[:, row, tokens].sum(-1) for row, tokens in enumerate(evidence)], dim=1)


def _best_head(mass: torch.Tensor) -> int:
    """The one head of a layer that looks best at the evidence over all of a sequence's rows.
    One head for every row, not each row's best: with several objects in view, heads that each
    settled on a different object (none of them reading the question) let every row find one head
    on its object (mass 0.94 while the answers barely moved: README, item 14 of the embedded model)."""
    return int(torch.log(mass.detach() + _EPSILON).mean(1).argmax())


def retrieval_loss(probe: Probe, evidence: list[list[int]]) -> torch.Tensor:
    """Mean over probed layers and rows of -log(attention mass on the row's evidence tokens) of
    that layer's best head (_best_head)."""
    losses = []
    for weights in probe.weights.values():
        mass = _evidence_mass(weights, evidence)
        losses.append(-torch.log(mass[_best_head(mass)] + _EPSILON))
    return torch.cat(losses).mean()


def best_head_mass(probe: Probe, evidence: list[list[int]]) -> torch.Tensor:
    """Per probed row, the best head's (_best_head) attention mass on its evidence, averaged over
    the probed layers: what the loss raises, recorded in validation."""
    masses = [_evidence_mass(weights, evidence) for weights in probe.weights.values()]
    return torch.stack([mass[_best_head(mass)] for mass in masses]).mean(0)
