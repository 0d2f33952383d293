"""Frozen-vision training: frame features computed once, fed to the language model as embeddings.

After stage 0 the vision tower no longer trains, so running it again on every frame of every
training window would only repeat the same arithmetic (it was about a quarter of a training
step). Instead each frame's tower output is stored once, and a training step builds the
language model's input embeddings itself: token embeddings, with the projector's output in the
image-token slots, exactly where LlavaForConditionalGeneration would scatter them. The
projector keeps training; the saved model is the same standard LLaVA.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .data import IGNORE
from .retrieval import probing, retrieval_layers, retrieval_loss
from .streams import RenderedStream


def compute_features(model, stream: RenderedStream, batch: int = 256) -> None:
    """Fill stream.features with the tower's patch tokens (as LLaVA selects them) and drop pixels."""
    tower = model.model.vision_tower
    layer, strategy = model.config.vision_feature_layer, model.config.vision_feature_select_strategy
    pieces = []
    with torch.inference_mode():
        for start in range(0, len(stream.pixels), batch):
            hidden = tower(pixel_values=stream.pixels[start:start + batch].float(),
                           output_hidden_states=True).hidden_states[layer]
            pieces.append((hidden[:, 1:] if strategy == "default" else hidden).half())
    stream.features = torch.cat(pieces)
    stream.pixels = None


def input_embeddings(model, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Token embeddings with projected frame features in the image-token slots, in order."""
    embeds = model.get_input_embeddings()(input_ids)
    image = model.model.multi_modal_projector(features.float()).reshape(-1, embeds.shape[-1])
    slots = (input_ids == model.config.image_token_index).unsqueeze(-1)
    return embeds.masked_scatter(slots, image.to(embeds.dtype))


def language_model_loss(model, batch: dict, logits: bool = False, frame_target_weight: float = 0.0,
                        retrieval_weight: float = 0.0):
    """The loss over answer tokens of one sequence, plus frame_target_weight times the loss over
    its dense per-frame targets (frame_targets.py) and retrieval_weight times the retrieval loss
    (retrieval.py; the model must use its attention), or its logits, for validation."""
    rows = batch.get("retrieval_rows") if retrieval_weight and not logits else None
    with probing(rows, retrieval_layers(model)) if rows else nullcontext() as probe:
        output = model(inputs_embeds=input_embeddings(model, batch["input_ids"], batch["features"]),
                       position_ids=batch["position_ids"], attention_mask=batch.get("attention_mask"))
    if logits:
        return output.logits
    scores = output.logits[0].float()
    loss = F.cross_entropy(scores[:-1], batch["labels"][0, 1:], ignore_index=IGNORE)
    targets = batch.get("frame_targets")
    if frame_target_weight and targets is not None and (targets != IGNORE).any():
        loss = loss + frame_target_weight * F.cross_entropy(scores, targets[0], ignore_index=IGNORE)
    if rows:
        loss = loss + retrieval_weight * retrieval_loss(probe, batch["retrieval_evidence"])
    return loss
