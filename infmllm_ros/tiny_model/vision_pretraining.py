"""Stage 0: teach the CLIP vision tower to see the synthetic world before it meets the language model.

LLaVA relies on a pretrained CLIP. Trained from scratch through the language model alone, with
one stream per step, the tower gets too few images and too weak a signal: on this data it stayed
at chance for thousands of steps while a directly supervised tower learnt to count in 200. So we
pretrain it the direct way, from batches of frames, then hand the weights to the LLaVA model.

Targets: every patch an object overlaps carries that object's colour and shape (the nearest
object's where two overlap), plus the frame's object count. An earlier target, the colour and
shape of the object *centred* in a patch only, called patches holding most of an object "empty"
and capped per-patch shape accuracy at 61 %; the language model must be able to key on an
object's shape wherever its pixels are, or it cannot retrieve it by shape later.

Frames are mirrored left-right at random (every shape of the world is left-right symmetric), and
held-out accuracy is reported per patch and per object (shape log-probabilities summed over the
patches an object holds: what a language model attending to all of its tokens can read).
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import CLIPVisionModel

from infmllm_ros.synthetic import COLOURS, COUNT_WORDS, HEIGHT, SHAPES, WIDTH
from infmllm_ros.synthetic.render import BOUND

from .architecture import GRID
from .streams import RenderedStream

IGNORE = -100
_OVERLAP = 0.8  # of the bounding circle: a patch "holds" an object closer than this to its box


def patches_held(x: float, y: float, radius: float) -> list[tuple[int, float]]:
    """(patch index, distance from the patch centre) of every patch an object at (x, y) of this
    radius, in camera pixels, holds: what the tower's patch tokens are taught to say it is."""
    cell_w, cell_h = WIDTH / GRID, HEIGHT / GRID
    held = []
    for row in range(GRID):
        for col in range(GRID):
            cx, cy = (col + 0.5) * cell_w, (row + 0.5) * cell_h
            gap = math.hypot(max(abs(x - cx) - cell_w / 2, 0.0), max(abs(y - cy) - cell_h / 2, 0.0))
            if gap < _OVERLAP * BOUND * radius:
                held.append((row * GRID + col, math.hypot(x - cx, y - cy)))
    return held


def patch_targets(objects: list[tuple[int, int, float, float, float]]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(colour, shape, owner) per patch from the objects' (colour, shape, x, y, radius): colour and
    shape 0 = nothing, owner = index of the object the patch holds (-1 = none)."""
    colour = torch.zeros(GRID * GRID, dtype=torch.long)
    shape = torch.zeros(GRID * GRID, dtype=torch.long)
    owner = torch.full((GRID * GRID,), -1, dtype=torch.long)
    nearest = torch.full((GRID * GRID,), math.inf)
    for number, (c, s, x, y, radius) in enumerate(objects):
        for cell, distance in patches_held(x, y, radius):
            if distance < nearest[cell]:
                nearest[cell], colour[cell], shape[cell], owner[cell] = distance, c + 1, s + 1, number
    return colour, shape, owner


def labelled_frames(streams: list[RenderedStream]):
    """(pixels, patch colour, patch shape, patch owner, object shapes, count) of every frame whose
    objects are all in view; object shapes are per frame, -1 padded to the most objects a frame holds."""
    pixels, colours, shapes, owners, object_shapes, counts = [], [], [], [], [], []
    for stream in streams:
        for index, objects in enumerate(stream.objects):
            if objects is None or len(objects) >= len(COUNT_WORDS):
                continue
            colour, shape, owner = patch_targets(objects)
            pixels.append(stream.pixels[index])
            colours.append(colour)
            shapes.append(shape)
            owners.append(owner)
            object_shapes.append(torch.tensor([o[1] for o in objects] + [-1] * (len(COUNT_WORDS) - len(objects))))
            counts.append(len(objects))
    return (torch.stack(pixels), torch.stack(colours), torch.stack(shapes), torch.stack(owners),
            torch.stack(object_shapes), torch.tensor(counts))


def _mirrored(pixels: torch.Tensor, *patch_labels: torch.Tensor):
    """The frames mirrored left-right, with their patch labels: every shape of the world is
    left-right symmetric (the triangle points up), so a mirrored frame is another valid frame."""
    flipped = [labels.view(-1, GRID, GRID).flip(-1).reshape(labels.shape) for labels in patch_labels]
    return (pixels.flip(-1), *flipped)


def object_shape_accuracy(shape_logits: torch.Tensor, owners: torch.Tensor, object_shapes: torch.Tensor) -> float:
    """Share of objects whose shape is the argmax of shape log-probabilities summed over the
    patches it holds: what a language model attending to all of an object's tokens could read."""
    log_probs = shape_logits.log_softmax(-1)[..., 1:]            # drop "nothing"
    right = total = 0
    for number in range(object_shapes.shape[1]):
        present = object_shapes[:, number] >= 0
        mask = (owners == number).unsqueeze(-1).float()
        summed = (log_probs * mask).sum(1)
        held = mask.sum((1, 2)) > 0
        counted = present & held
        right += (summed.argmax(-1) == object_shapes[:, number])[counted].sum().item()
        total += present.sum().item()
    return right / max(total, 1)


def pretrain_vision_tower(tower: CLIPVisionModel, streams: list[RenderedStream], held_out: list[RenderedStream],
                          steps: int = 1500, batch: int = 64, lr: float = 2e-3, seed: int = 0,
                          mirror: bool = True, evaluate_every: int = 0, head_steps: int = 0,
                          head_lr: float = 3e-3) -> dict:
    """Train `tower` in place on the patch/count targets; returns held-out accuracies (and, with
    `evaluate_every`, their history). `head_steps`: first fit the new heads alone on the tower as it
    is (a tower trained before: its accuracy with them is reported as `inherited`)."""
    pixels, colours, shapes, _, _, counts = labelled_frames(streams)
    held = labelled_frames(held_out)
    width = tower.config.hidden_size
    heads = torch.nn.ModuleDict({"colour": torch.nn.Linear(width, len(COLOURS) + 1),
                                 "shape": torch.nn.Linear(width, len(SHAPES) + 1),
                                 "count": torch.nn.Linear(width * GRID * GRID, len(COUNT_WORDS))})
    sampler = random.Random(seed)

    def logits(batch_pixels):
        # the same features LLaVA will read: the last layer's patch tokens (CLS dropped)
        patches = tower(pixel_values=batch_pixels.float()).last_hidden_state[:, 1:]
        return heads["colour"](patches), heads["shape"](patches), heads["count"](patches.flatten(1))

    def evaluate() -> dict:
        tower.eval()
        held_pixels, held_colours, held_shapes, owners, object_shapes, held_counts = held
        with torch.inference_mode():
            parts = [logits(held_pixels[i:i + 512]) for i in range(0, len(held_pixels), 512)]
        colour_logits, shape_logits, count_logits = (torch.cat(p) for p in zip(*parts))
        occupied = held_colours > 0
        return {"patch_colour": (colour_logits.argmax(-1) == held_colours)[occupied].float().mean().item(),
                "patch_shape": (shape_logits.argmax(-1) == held_shapes)[occupied].float().mean().item(),
                "object_shape": object_shape_accuracy(shape_logits, owners, object_shapes),
                "count": (count_logits.argmax(-1) == held_counts).float().mean().item()}

    def train(phase_steps: int, phase_lr: float, parameters: list, desc: str, history: list | None) -> None:
        optimizer = torch.optim.AdamW(parameters, lr=phase_lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=phase_lr, total_steps=phase_steps,
                                                       pct_start=0.1)
        tower.train()
        for step in tqdm(range(phase_steps), desc=desc, unit="step"):
            pick = torch.tensor([sampler.randrange(len(pixels)) for _ in range(batch)])
            batch_pixels, batch_colours, batch_shapes = pixels[pick], colours[pick], shapes[pick]
            if mirror:
                flip = torch.rand(batch) < 0.5
                mirrored = _mirrored(batch_pixels[flip], batch_colours[flip], batch_shapes[flip])
                batch_pixels[flip], batch_colours[flip], batch_shapes[flip] = mirrored
            colour_logits, shape_logits, count_logits = logits(batch_pixels)
            loss = (F.cross_entropy(colour_logits.flatten(0, 1), batch_colours.flatten())
                    + F.cross_entropy(shape_logits.flatten(0, 1), batch_shapes.flatten())
                    + F.cross_entropy(count_logits, counts[pick]))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            if history is not None and evaluate_every and (step + 1) % evaluate_every == 0 and step + 1 < phase_steps:
                history.append({"step": step + 1, **evaluate()})
                tower.train()
                tqdm.write(f"vision step {step + 1}: " + " ".join(f"{k} {v:.3f}" for k, v in history[-1].items()
                                                                 if k != "step"))

    inherited = None
    if head_steps:
        tower.requires_grad_(False)
        train(head_steps, head_lr, list(heads.parameters()), "vision heads on the inherited tower", None)
        tower.requires_grad_(True)
        inherited = evaluate()
        tqdm.write("inherited tower (held out): " + " ".join(f"{k} {v:.3f}" for k, v in inherited.items()))
    history = []
    train(steps, lr, list(tower.parameters()) + list(heads.parameters()), "vision pretraining", history)
    result = evaluate()
    if evaluate_every:
        result["history"] = history + [{"step": steps, **result}]
    if inherited is not None:
        result["inherited"] = inherited
    return result
