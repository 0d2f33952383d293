"""Where a training question's answer lies in a frame: the patches of the object it asks about.

Retrieval supervision (retrieval.py) first pointed a memory answer's attention at the whole
frames that show its object. Attention went there and the answers did not follow, because the
model then had to pick the asked object out of a frame of several: with two or three objects in
view it named the wrong one about half the time, even about the frame in front of it (README,
item 13). A single attention head over the frozen tower's 16 patch tokens, its query learnt per
asked shape, reads that object's colour on 99 % of held-out frames with two or three objects,
where an MLP over the whole frame reads 63 % (bench/figures/binding/attention_probe.py): the
tower binds colour to shape patch by patch, and it is attention that has to pick the patch. So
the evidence becomes the asked object's own patches, and current-scene questions get evidence
too: the object's patches in the newest frame.
"""

from __future__ import annotations

from infmllm_ros.synthetic import COLOURS, SHAPES

from .vision_pretraining import patches_held

_COLOUR_INDEX = {name: index for index, name in enumerate(COLOURS)}
_SHAPE_INDEX = {name: index for index, name in enumerate(SHAPES)}


def asked_object(text: str, answer: str) -> tuple[int, int] | None:
    """(colour index, shape index) of the object a question is about. Every question of the world
    but "how many?" names one colour and one shape between its text and its answer ("what colour
    is the cross?" "green"); None for the others."""
    words = (text + " " + answer).replace("?", " ").split()
    colours = {_COLOUR_INDEX[word] for word in words if word in _COLOUR_INDEX}
    shapes = {_SHAPE_INDEX[word] for word in words if word in _SHAPE_INDEX}
    if len(colours) != 1 or len(shapes) != 1:
        return None
    return colours.pop(), shapes.pop()


def object_patches(objects: list[tuple[int, int, float, float, float]] | None,
                   about: tuple[int, int]) -> list[int]:
    """Indices of the patches (0-15) that hold the object `about` in a frame with these objects
    ((colour, shape, x, y, radius) each, streams.frame_objects); none when the frame shows it
    only in part (objects None) or not at all."""
    for colour, shape, x, y, radius in objects or []:
        if (colour, shape) == about:
            return sorted(cell for cell, _ in patches_held(x, y, radius))
    return []
