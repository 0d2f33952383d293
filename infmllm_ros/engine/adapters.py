"""Per-family knowledge the session needs: prompt strings and token positions.

Everything else (vision towers, projectors, merging image features into the text) is left to
the model's own forward, called exactly as transformers does for that checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .cache import ChunkLayout

PROMPT_FILE = "infmllm_prompt.json"


@dataclass(frozen=True)
class PromptFormat:
    """How a stream is written as text. `frame` holds the processor's image placeholder.

    A model directory may override the family default with an `infmllm_prompt.json` holding the
    same fields (the embedded model does: it was trained on its own format).
    """

    frame: str
    question: str                 # with "{question}"
    stop: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def for_model(cls, model_dir: Path, family: str) -> "PromptFormat":
        override = model_dir / PROMPT_FILE
        if override.is_file():
            data = json.loads(override.read_text())
            return cls(frame=data["frame"], question=data["question"], stop=tuple(data.get("stop", ())))
        return DEFAULT_PROMPTS[family]


DEFAULT_PROMPTS = {
    "llava": PromptFormat(frame="USER: <image>\n", question="USER: {question}\nASSISTANT:", stop=("\n", "</s>")),
    "qwen2_vl": PromptFormat(
        frame="<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n",
        question="<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", stop=("<|im_end|>",)),
    "idefics3": PromptFormat(frame="User:<image><end_of_utterance>\n",
                             question="User: {question}<end_of_utterance>\nAssistant:",
                             stop=("<end_of_utterance>",)),
}
DEFAULT_PROMPTS["qwen2_5_vl"] = DEFAULT_PROMPTS["qwen2_vl"]
DEFAULT_PROMPTS["smolvlm"] = DEFAULT_PROMPTS["idefics3"]


class SequentialPositions:
    """Plain RoPE (LLaVA on Llama/Qwen2, Idefics3/SmolVLM): token i of a chunk sits at start + i,
    and every token is its own segment."""

    def __init__(self, model) -> None:
        self.model = model

    def layout(self, inputs: dict, start: int, first_segment: int) -> tuple[ChunkLayout, torch.Tensor]:
        count = inputs["input_ids"].shape[-1]
        positions = torch.arange(start, start + count)
        layout = ChunkLayout(positions=positions[:, None].expand(-1, 3), segments=torch.arange(count) + first_segment)
        return layout, positions[None]


class MultimodalRotaryPositions:
    """M-RoPE (Qwen2-VL, Qwen2.5-VL): 3-axis positions from the model's own `get_rope_index`,
    offset to `start`. A frame's visual tokens form one segment so re-indexing keeps their grid."""

    def __init__(self, model) -> None:
        self.model = model

    def layout(self, inputs: dict, start: int, first_segment: int) -> tuple[ChunkLayout, torch.Tensor]:
        input_ids = inputs["input_ids"]
        token_types = inputs.get("mm_token_type_ids")
        if token_types is None:
            token_types = torch.zeros_like(input_ids)
        rope_index, _ = self.model.model.get_rope_index(
            input_ids, token_types, image_grid_thw=inputs.get("image_grid_thw"))
        position_ids = rope_index + start                                  # (3, 1, n)
        visual = token_types[0] != 0
        # A new segment wherever a token is text or a visual run begins.
        starts = ~visual | torch.cat([torch.tensor([True]), ~visual[:-1]])
        segments = starts.long().cumsum(0) - 1 + first_segment
        return ChunkLayout(positions=position_ids[:, 0].T.contiguous(), segments=segments), position_ids


POSITIONS = {"llava": SequentialPositions, "idefics3": SequentialPositions, "smolvlm": SequentialPositions,
             "qwen2_vl": MultimodalRotaryPositions, "qwen2_5_vl": MultimodalRotaryPositions}


def positions_for(model):
    """The position scheme of a loaded model, or a clear error for an unsupported family."""
    family = model.config.model_type
    if family not in POSITIONS:
        raise ValueError(f"model family {family!r} is not supported; supported: {sorted(POSITIONS)}")
    return POSITIONS[family](model)
