"""Run Z5 (README, item 14 of the embedded model), not kept: infmllm-train-tiny with every image token
of a frame also predicting, through the tied LM head, the shape word of the object its patch holds
(the vision stage's labels), in place of the dense frame targets of --frame-target-weight. If the
language model could not key attention on a shape because its image tokens hold shape in no
direction the shape's word can match, this gives them one.

usage (from the repository root): python bench/figures/binding/train_patch_shape_words.py ARGS
(the arguments of infmllm-train-tiny; give --frame-target-weight to weigh these targets)"""
import sys

import infmllm_ros.tiny_model.data as data
import infmllm_ros.tiny_model.train as train
from infmllm_ros.synthetic import SHAPES
from infmllm_ros.tiny_model.architecture import IMAGE_TOKENS
from infmllm_ros.tiny_model.vision_pretraining import patch_targets

data.FIRST_TARGET_TOKEN = 1   # targets from the frame's first image token on, one per patch


def patch_shape_words(stream, index, shown_before):
    objects = stream.objects[index]
    if objects is None:   # an object only partly in view: labels ambiguous
        return [None] * IMAGE_TOKENS
    _, shape, _ = patch_targets(objects)
    return [SHAPES[s - 1] if s > 0 else None for s in shape.tolist()]


data.frame_words = patch_shape_words
sys.exit(train.main(sys.argv[1:]))
