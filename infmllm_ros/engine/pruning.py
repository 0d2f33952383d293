"""Temporal token pruning: a frame's visual tokens that repeat what the cache already holds are not appended.

A static or slow camera sends nearly the same picture every frame; TimeChat-Online drops most such
tokens on video and keeps its accuracy. A visual token is dropped when its embedding (the language
model's input: the vision tower and projector's output for that patch) has cosine similarity of at
least `threshold` with the embedding the same patch last had when it *was* appended. Comparing with
the last appended embedding, not the previous frame's, means slow drift is caught: a patch that
changes a little every frame is sent again once it has moved `threshold` away from what the model saw.

With `whole_frames`, a frame is the unit: it is appended whole when any of its patches changed, and
left out entirely (its text tokens too) when none did, its positions skipped as a gap in the stream.
A model trained on whole frames only (the embedded one) never sees a frame with holes that way; it
sees gaps, which its training windows have.

The kept tokens keep the positions they would have had in the full frame (the cache lays out the
whole frame and keeps the chosen columns), so M-RoPE grids stay intact and a frame's tokens never
slide into its neighbour's positions.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class _Captured(Exception):
    """Raised by the hook once the language model's input is in hand: the rest of the forward is skipped."""

    def __init__(self, embeddings: torch.Tensor) -> None:
        super().__init__()
        self.embeddings = embeddings


@contextmanager
def _stop_at_language_model(decoder):
    def capture(module, args, kwargs):
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
        return captured.embeddings
    raise RuntimeError(f"{model.config.model_type}: the language model was never called with inputs_embeds")


class TemporalPruner:
    """Chooses which tokens of each frame to append; remembers, per patch, the embedding last appended."""

    def __init__(self, threshold: float, image_token_id: int, whole_frames: bool = False) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"prune_similarity must be in (0, 1] (0 turns pruning off), got {threshold}")
        self.threshold = threshold
        self.whole_frames = whole_frames
        self.image_token_id = image_token_id
        self.reference: torch.Tensor | None = None   # (visual tokens per frame, hidden)
        self.frames = 0
        self.visual_tokens = 0
        self.pruned_tokens = 0

    def reset(self) -> None:
        """A new stream: the next frame is appended whole."""
        self.reference = None

    def select(self, input_ids: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Which of the frame's tokens (input_ids (1, n), embeddings (1, n, hidden)) to append: (n,) bool.
        Text tokens always; a visual token when its patch changed since it was last appended. With
        `whole_frames`: every token when any patch changed, none when none did."""
        visual = input_ids[0] == self.image_token_id
        features = embeddings[0, visual].float()
        keep = torch.ones_like(visual)
        if self.reference is None or self.reference.shape != features.shape:   # first frame, or a new size
            changed = torch.ones(features.shape[0], dtype=torch.bool, device=features.device)
            self.reference = features.clone()
        else:
            changed = torch.nn.functional.cosine_similarity(features, self.reference, dim=-1) < self.threshold
            if self.whole_frames:
                changed[:] = bool(changed.any())
            self.reference[changed] = features[changed]
        keep[visual] = changed
        if self.whole_frames and not changed.any():
            keep[:] = False
        self.frames += 1
        self.visual_tokens += int(visual.sum())
        self.pruned_tokens += int((~changed).sum())
        return keep
