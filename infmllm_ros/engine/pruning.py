"""Temporal token pruning: a frame's visual tokens that repeat what the cache already holds are not appended.

A static or slow camera sends nearly the same picture every frame; TimeChat-Online drops most such
tokens on video and keeps its accuracy. A visual token is dropped when its embedding (the language
model's input: the vision tower and projector's output for that patch) has cosine similarity of at
least `threshold` with the embedding the same patch last had when it *was* appended. Comparing with
the last appended embedding, not the previous frame's, means slow drift is caught: a patch that
changes a little every frame is sent again once it has moved `threshold` away from what the model saw.
A pruned patch leans on its earlier copy, so when the cache evicts that copy the patch is sent again
(the session checks after evictions): a camera that stops moving does not vanish from a bounded cache.

With `whole_frames`, a frame is the unit: it is appended whole when any of its patches changed, and
left out entirely (its text tokens too) when none did, its positions skipped as a gap in the stream.
A model trained on whole frames only (the embedded one) never sees a frame with holes that way; it
sees gaps, which its training windows have.

The kept tokens take the positions they would have had in the whole frame (the cache lays out the
whole frame and keeps the chosen columns), and the next frame starts where it would have. The next
eviction re-indexes the cache as it always does (StreamingLLM-style packing), which closes these holes
and gaps as it closes those of evicted tokens; a frame's M-RoPE grid moves as one piece, so its
internal layout survives that too.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


class _Captured(Exception):
    """Raised by the hook once the language model's input is in hand: the rest of the forward is skipped."""

    def __init__(self, embeddings: torch.Tensor) -> None:
        super().__init__()
        self.embeddings = embeddings


#: what a language model may receive besides its input embeddings; a tensor under any other name (e.g.
#: Qwen3-VL's deepstack features) is vision data the pruned forward, fed inputs_embeds alone, would drop
_PLAIN_ARGUMENTS = {"inputs_embeds", "attention_mask", "position_ids", "cache", "past_key_values", "use_cache",
                    "cache_position", "return_dict", "output_attentions", "output_hidden_states"}


@contextmanager
def _stop_at_language_model(decoder):
    def capture(module, args, kwargs):
        extra = [name for name, value in kwargs.items()
                 if name not in _PLAIN_ARGUMENTS and isinstance(value, torch.Tensor)]
        if args or extra:
            raise NotImplementedError(f"temporal pruning: this model hands its language model more than input "
                                      f"embeddings ({extra or 'positional arguments'}); set prune_similarity to 0")
        raise _Captured(kwargs["inputs_embeds"])
    handle = decoder.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def merged_embeddings(model, inputs: dict) -> torch.Tensor:
    """The language model's input embeddings for `inputs` (text and image features merged), (1, n, hidden).

    Each family merges image features its own way (LLaVA scatters the projector's output, Idefics3
    has an inputs_merger, Qwen2-VL merges after its own patch merger); running the model's own
    forward up to its language model and taking what that receives uses each family's code as
    transformers ships it, instead of a re-implementation per family that could drift from it.
    """
    model_inputs = {k: v for k, v in inputs.items() if k != "attention_mask"}
    try:
        with torch.inference_mode(), _stop_at_language_model(model.get_decoder()):
            model.model(**model_inputs, use_cache=False)
    except _Captured as captured:
        if captured.embeddings.shape[1] != inputs["input_ids"].shape[-1]:
            raise RuntimeError(f"{model.config.model_type}: the language model's input has "
                               f"{captured.embeddings.shape[1]} tokens, the frame {inputs['input_ids'].shape[-1]}")
        return captured.embeddings
    raise RuntimeError(f"{model.config.model_type}: the language model was never called with inputs_embeds")


#: cosine similarity in float32 puts a vector's similarity with itself a few 1e-7 below 1
SIMILARITY_TOLERANCE = 1e-6


@dataclass
class _Pending:
    """What `select` chose for a frame, applied by `commit` once the frame is in the cache."""

    features: torch.Tensor   # (patches, hidden)
    changed: torch.Tensor    # (patches,) bool: appended
    keep: torch.Tensor       # (n,) bool over the frame's tokens
    visual: torch.Tensor     # (n,) bool


class TemporalPruner:
    """Chooses which tokens of each frame to append; remembers, per patch, the embedding it last appended
    and that token's index in the stream, so a patch whose appended token the cache evicted is sent again."""

    def __init__(self, threshold: float, image_token_id: int, whole_frames: bool = False) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"prune_similarity must be in (0, 1] (0 turns pruning off), got {threshold}")
        self.threshold = threshold
        self.whole_frames = whole_frames
        self.image_token_id = image_token_id
        self.reference: torch.Tensor | None = None       # (patches, hidden): last appended embeddings
        self.appended_at: torch.Tensor | None = None     # (patches,) long: their stream token indices
        self.stale: torch.Tensor | None = None           # (patches,) bool: their token left the cache
        self.pending: _Pending | None = None
        self.frames = self.visual_tokens = self.pruned_tokens = 0   # since the session started

    def reset(self) -> None:
        """A new stream: the next frame is appended whole."""
        self.reference = self.appended_at = self.stale = self.pending = None

    def forget(self, gone: torch.Tensor) -> None:
        """Patches (bool mask) whose last appended token the cache no longer holds: they are appended
        again next frame, however little they changed."""
        if self.stale is not None:
            self.stale |= gone.to(self.stale.device)

    def select(self, input_ids: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Which of the frame's tokens (input_ids (1, n), embeddings (1, n, hidden)) to append: (n,) bool.
        Text tokens always; a visual token when its patch changed since it was last appended (or that
        token was evicted). With `whole_frames`: every token when any patch changed, none when none did.
        Nothing is remembered until `commit` (the forward may fail)."""
        visual = input_ids[0] == self.image_token_id
        features = embeddings[0, visual].float()
        if self.reference is None or self.reference.shape != features.shape:   # first frame, or a new size
            changed = torch.ones(features.shape[0], dtype=torch.bool, device=features.device)
        else:
            similarity = torch.nn.functional.cosine_similarity(features, self.reference, dim=-1)
            changed = (similarity < self.threshold - SIMILARITY_TOLERANCE) | self.stale
            if self.whole_frames:
                changed[:] = bool(changed.any())
        keep = torch.ones_like(visual)
        keep[visual] = changed
        if self.whole_frames and not changed.any():
            keep[:] = False
        self.pending = _Pending(features, changed, keep, visual)
        return keep

    def commit(self, first_token: int) -> None:
        """The selected tokens are in the cache, from stream token index `first_token` on."""
        pending, self.pending = self.pending, None
        changed = pending.changed
        kept_index = first_token + pending.keep.long().cumsum(0) - 1   # stream index of each kept token
        if self.reference is None or self.reference.shape != pending.features.shape:
            self.reference = pending.features.clone()
            self.appended_at = kept_index[pending.visual].clone()
            self.stale = torch.zeros_like(changed)
        else:
            self.reference[changed] = pending.features[changed]
            self.appended_at[changed] = kept_index[pending.visual][changed]
            self.stale &= ~changed
        self.frames += 1
        self.visual_tokens += int(pending.visual.sum())
        self.pruned_tokens += int((~changed).sum())
