"""Stage 0: teach the CLIP vision tower to see the synthetic world before it meets the language model.

LLaVA relies on a pretrained CLIP. Trained from scratch through the language model alone, with
one stream per step, the tower gets too few images and too weak a signal: on this data it stayed
at chance for thousands of steps while a directly supervised tower learnt to count in 200. So we
pretrain it the direct way: per-patch colour and shape of the object centred in that patch, and
the object count, from batches of frames, then hand the weights to the LLaVA model.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import CLIPVisionModel

from infmllm_ros.synthetic import COLOURS, COUNT_WORDS, HEIGHT, SHAPES, WIDTH, generate_episode

from .architecture import CONTEXT_FRAMES, IMAGE_SIZE, PATCH_SIZE
from .data import RenderedEpisode

GRID = IMAGE_SIZE // PATCH_SIZE
IGNORE = -100


def frame_labels(episodes: list[RenderedEpisode]):
    """(pixels, patch colour, patch shape, count) for every frame whose objects are all in view."""
    pixels, colours, shapes, counts = [], [], [], []
    colour_index = {name: i + 1 for i, name in enumerate(COLOURS)}   # 0 = no object centred here
    shape_index = {name: i + 1 for i, name in enumerate(SHAPES)}
    for episode in episodes:
        world = generate_episode(episode.seed, CONTEXT_FRAMES + 1.0)
        for index, t in enumerate(episode.frame_times):
            visible = world.visible(float(t))
            if not all(state.fully_in_view for state in visible) or len(visible) >= len(COUNT_WORDS):
                continue
            colour_grid = torch.zeros(GRID * GRID, dtype=torch.long)
            shape_grid = torch.zeros(GRID * GRID, dtype=torch.long)
            for state in visible:
                cell = min(int(state.y / HEIGHT * GRID), GRID - 1) * GRID + min(int(state.x / WIDTH * GRID), GRID - 1)
                colour_grid[cell] = colour_index[state.colour]
                shape_grid[cell] = shape_index[state.shape]
            pixels.append(episode.pixels[index])
            colours.append(colour_grid)
            shapes.append(shape_grid)
            counts.append(len(visible))
    return torch.stack(pixels), torch.stack(colours), torch.stack(shapes), torch.tensor(counts)


def pretrain_vision_tower(tower: CLIPVisionModel, episodes: list[RenderedEpisode], steps: int = 500,
                          batch: int = 32, lr: float = 1e-3, seed: int = 0) -> dict:
    """Train `tower` in place on the patch/count targets; returns final training accuracies."""
    pixels, colours, shapes, counts = frame_labels(episodes)
    width = tower.config.hidden_size
    heads = torch.nn.ModuleDict({"colour": torch.nn.Linear(width, len(COLOURS) + 1),
                                 "shape": torch.nn.Linear(width, len(SHAPES) + 1),
                                 "count": torch.nn.Linear(width * GRID * GRID, len(COUNT_WORDS))})
    optimizer = torch.optim.AdamW(list(tower.parameters()) + list(heads.parameters()), lr=lr, weight_decay=0.01)
    sampler = random.Random(seed)
    tower.train()
    accuracy = {}
    for _ in tqdm(range(steps), desc="vision pretraining", unit="step"):
        pick = torch.tensor([sampler.randrange(len(pixels)) for _ in range(batch)])
        # the same features LLaVA will read: the last layer's patch tokens (CLS dropped)
        patches = tower(pixel_values=pixels[pick].float(), output_hidden_states=True).hidden_states[-1][:, 1:]
        colour_logits, shape_logits = heads["colour"](patches), heads["shape"](patches)
        count_logits = heads["count"](patches.flatten(1))
        loss = (F.cross_entropy(colour_logits.flatten(0, 1), colours[pick].flatten())
                + F.cross_entropy(shape_logits.flatten(0, 1), shapes[pick].flatten())
                + F.cross_entropy(count_logits, counts[pick]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        occupied = colours[pick] > 0
        accuracy = {"patch_colour": (colour_logits.argmax(-1) == colours[pick])[occupied].float().mean().item(),
                    "patch_shape": (shape_logits.argmax(-1) == shapes[pick])[occupied].float().mean().item(),
                    "count": (count_logits.argmax(-1) == counts[pick]).float().mean().item()}
    return accuracy
