"""A question's queries, read during one forward: what stored frames are scored against for recall.

Forward hooks on each decoder layer's query projection see the queries before RoPE turns them, so
they compare with the recall store's un-rotated keys without undoing any rotation. Where the
attention normalises queries per head before RoPE (`q_norm`: Qwen3, Gemma 3; its keys are stored
after `k_norm`), the hook sits on that norm instead, so queries and stored keys are alike. Query
heads are grouped by the KV head they read (grouped-query attention).

Only the forward's last token is kept: the question's final token is the one whose attention
predicts the answer's first word, so its queries are the ones that look for the evidence. In a
one-off comparison while building this (the embedded model, one 10-minute episode, 55 distant
questions, 4 frames recalled of ~500 stored), the last token's queries over all layers found a frame
of the evidence for 26, every token of the question for 19, its words without the markers for 17.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


class QueryProbe:
    """Collects, per decoder layer, the pre-RoPE queries of the last token forwarded while attached."""

    def __init__(self, model) -> None:
        text = model.config.get_text_config()
        self.heads = text.num_attention_heads
        self.kv_heads = getattr(text, "num_key_value_heads", None) or self.heads
        self.layers = model.get_decoder().layers
        if not all(hasattr(layer, "self_attn") and hasattr(layer.self_attn, "q_proj") for layer in self.layers):
            raise ValueError(f"recall needs a separate query projection (self_attn.q_proj) in every layer; "
                             f"{model.config.model_type} has none")
        self.queries: list[torch.Tensor | None] = [None] * len(self.layers)

    @contextmanager
    def attached(self) -> Iterator["QueryProbe"]:
        handles = [query_output(layer.self_attn).register_forward_hook(self._hook(number))
                   for number, layer in enumerate(self.layers)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, number: int):
        def keep(module, inputs, output):
            last = output[0, -1].detach().float()   # (heads * dim) from q_proj, (heads, dim) from q_norm
            self.queries[number] = last.reshape(self.kv_heads, self.heads // self.kv_heads, -1)   # (kv, group, dim)
        return keep

    def grouped(self) -> list[torch.Tensor]:
        """Per layer (kv_heads, query heads per KV head, head_dim): what `RecallStore.best` scores with."""
        if any(queries is None for queries in self.queries):
            raise RuntimeError("no forward ran while the probe was attached")
        return list(self.queries)


def query_output(attention) -> torch.nn.Module:
    """The module whose output is the attention's queries just before RoPE: q_norm where it has one."""
    norm = getattr(attention, "q_norm", None)
    return norm if isinstance(norm, torch.nn.Module) else attention.q_proj
