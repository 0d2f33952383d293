"""Grow a trained language model wider without changing what it computes (Net2Net-style).

A wider model trained from nothing loses what the shipped weights learnt over several runs (README,
"The embedded model": the one-command recipe did not reproduce them), so capacity is added to the
trained model instead: more attention heads (and KV heads, same head size and grouping) and a wider
MLP. Each trained tensor goes into the leading block of the wider one; the new heads' and MLP units'
input weights keep the wider model's fresh initialisation, and the weights that write their outputs
back to the residual stream (`o_proj`, `down_proj` columns) start at zero. So the wider model gives
the trained model's logits exactly, and the new parts grow from the first gradient step (as LoRA's
zero-initialised B does).
"""

from __future__ import annotations

import torch

#: weights whose input columns read the new heads' or units' outputs: zero, so nothing changes at first
_OUTPUT_WEIGHTS = ("o_proj.weight", "down_proj.weight")
#: the only tensors that may grow: a wider vision tower or hidden size would change what layer norms
#: and the residual stream compute, which no placement of the old weights preserves
_GROWABLE = tuple(f"{name}.{part}" for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj") for part in ("weight", "bias"))


def widen_into(trained_model: torch.nn.Module, wide: torch.nn.Module) -> list[str]:
    """Load `trained_model` (the same weights' names, every tensor no larger) into `wide`,
    function-preserving; returns the names of the tensors that grew. Raises ValueError with the
    first thing that cannot be placed."""
    _check_same_head_layout(trained_model.config.get_text_config(), wide.config.get_text_config())
    trained, target = trained_model.state_dict(), wide.state_dict()
    missing, unexpected = set(target) - set(trained), set(trained) - set(target)
    if missing or unexpected:
        raise ValueError(f"the models differ in their weights: {sorted(missing | unexpected)[0]}")
    grown, state = [], {}
    for name, weight in trained.items():
        fresh = target[name]
        if weight.shape == fresh.shape:
            state[name] = weight
            continue
        if "language_model" not in name or not name.endswith(_GROWABLE):
            raise ValueError(f"{name}: only the language model's attention and MLP projections can grow")
        if weight.dim() != fresh.dim() or any(a > b for a, b in zip(weight.shape, fresh.shape)):
            raise ValueError(f"{name}: {tuple(weight.shape)} does not fit in {tuple(fresh.shape)}")
        wider = fresh.clone()
        if name.endswith(_OUTPUT_WEIGHTS):
            wider[:, weight.shape[1]:] = 0
        wider[tuple(slice(0, n) for n in weight.shape)] = weight
        state[name] = wider
        grown.append(name)
    wide.load_state_dict(state)
    return grown


def _check_same_head_layout(trained, wide) -> None:
    """Each trained query head stays on its KV head only if the heads' size and the query heads per
    KV head are unchanged (transformers groups query head h with KV head h // group)."""
    def layout(config):
        return config.head_dim, config.num_attention_heads // config.num_key_value_heads
    if layout(trained) != layout(wide):
        raise ValueError(f"heads of size {trained.head_dim}, {layout(trained)[1]} per KV head, cannot grow into "
                         f"{wide.head_dim}, {layout(wide)[1]} per KV head")
