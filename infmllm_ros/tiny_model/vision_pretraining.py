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


def patch_targets(objects: list[tuple[int, int, float, float, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(colour, shape) per patch, 0 = nothing; from the objects' (colour, shape, x, y, radius)."""
    colour = torch.zeros(GRID * GRID, dtype=torch.long)
    shape = torch.zeros(GRID * GRID, dtype=torch.long)
    nearest = torch.full((GRID * GRID,), math.inf)
    cell_w, cell_h = WIDTH / GRID, HEIGHT / GRID
    for c, s, x, y, radius in objects:
        for row in range(GRID):
            for col in range(GRID):
                cx, cy = (col + 0.5) * cell_w, (row + 0.5) * cell_h
                gap = math.hypot(max(abs(x - cx) - cell_w / 2, 0.0), max(abs(y - cy) - cell_h / 2, 0.0))
                distance = math.hypot(x - cx, y - cy)
                cell = row * GRID + col
                if gap < _OVERLAP * BOUND * radius and distance < nearest[cell]:
                    nearest[cell], colour[cell], shape[cell] = distance, c + 1, s + 1
    return colour, shape


def labelled_frames(streams: list[RenderedStream]):
    """(pixels, patch colour, patch shape, count) of every frame whose objects are all in view."""
    pixels, colours, shapes, counts = [], [], [], []
    for stream in streams:
        for index, objects in enumerate(stream.objects):
            if objects is None or len(objects) >= len(COUNT_WORDS):
                continue
            colour, shape = patch_targets(objects)
            pixels.append(stream.pixels[index])
            colours.append(colour)
            shapes.append(shape)
            counts.append(len(objects))
    return torch.stack(pixels), torch.stack(colours), torch.stack(shapes), torch.tensor(counts)


def pretrain_vision_tower(tower: CLIPVisionModel, streams: list[RenderedStream], held_out: list[RenderedStream],
                          steps: int = 1500, batch: int = 64, lr: float = 2e-3, seed: int = 0) -> dict:
    """Train `tower` in place on the patch/count targets; returns held-out accuracies."""
    pixels, colours, shapes, counts = labelled_frames(streams)
    width = tower.config.hidden_size
    heads = torch.nn.ModuleDict({"colour": torch.nn.Linear(width, len(COLOURS) + 1),
                                 "shape": torch.nn.Linear(width, len(SHAPES) + 1),
                                 "count": torch.nn.Linear(width * GRID * GRID, len(COUNT_WORDS))})
    optimizer = torch.optim.AdamW(list(tower.parameters()) + list(heads.parameters()), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    sampler = random.Random(seed)

    def logits(batch_pixels):
        # the same features LLaVA will read: the last layer's patch tokens (CLS dropped)
        patches = tower(pixel_values=batch_pixels.float()).last_hidden_state[:, 1:]
        return heads["colour"](patches), heads["shape"](patches), heads["count"](patches.flatten(1))

    tower.train()
    for _ in tqdm(range(steps), desc="vision pretraining", unit="step"):
        pick = torch.tensor([sampler.randrange(len(pixels)) for _ in range(batch)])
        colour_logits, shape_logits, count_logits = logits(pixels[pick])
        loss = (F.cross_entropy(colour_logits.flatten(0, 1), colours[pick].flatten())
                + F.cross_entropy(shape_logits.flatten(0, 1), shapes[pick].flatten())
                + F.cross_entropy(count_logits, counts[pick]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
    tower.eval()
    pixels, colours, shapes, counts = labelled_frames(held_out)
    with torch.inference_mode():
        colour_logits, shape_logits, count_logits = logits(pixels)
    occupied = colours > 0
    return {"patch_colour": (colour_logits.argmax(-1) == colours)[occupied].float().mean().item(),
            "patch_shape": (shape_logits.argmax(-1) == shapes)[occupied].float().mean().item(),
            "count": (count_logits.argmax(-1) == counts).float().mean().item()}
