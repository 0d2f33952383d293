"""Load any local Hugging Face MLLM directory: model, processor, and the fixes offline CPUs need.

Everything loads with `local_files_only=True`: robots and CI have no model hub. torchvision is not
installable here, so the Pil image processors are used, and the Qwen-VL processors (which insist
on a video processor that needs torchvision) are replaced by image-only subclasses.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForImageTextToText, AutoProcessor, Qwen2_5_VLConfig,
                          Qwen2_5_VLProcessor, Qwen2VLConfig, Qwen2VLProcessor)
from transformers.processing_utils import ProcessorMixin
from transformers.utils import logging as hf_logging

from infmllm_ros.models import embedded_model_path

from .adapters import POSITIONS
from .quantization import (QuantizationError, apply_dynamic_int8, bitsandbytes_config, language_linear_weights,
                           resolve_mode)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelLoadError(RuntimeError):
    """A model directory that cannot serve: missing, incomplete, or asked for an impossible setting."""


def _init_image_only(processor, image_processor, tokenizer, chat_template):
    processor.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
    processor.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
    processor.image_token_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    processor.video_token_id = tokenizer.convert_tokens_to_ids(processor.video_token)
    ProcessorMixin.__init__(processor, image_processor, tokenizer, chat_template=chat_template)


class Qwen2VLImageOnlyProcessor(Qwen2VLProcessor):
    """Qwen2-VL processor without the video slot (its sub-processors come from this signature)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        _init_image_only(self, image_processor, tokenizer, chat_template)


class Qwen2_5_VLImageOnlyProcessor(Qwen2_5_VLProcessor):
    """Qwen2.5-VL processor without the video slot."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        _init_image_only(self, image_processor, tokenizer, chat_template)


AutoProcessor.register(Qwen2VLConfig, Qwen2VLImageOnlyProcessor, exist_ok=True)
AutoProcessor.register(Qwen2_5_VLConfig, Qwen2_5_VLImageOnlyProcessor, exist_ok=True)
_IMAGE_ONLY = {"qwen2_vl": Qwen2VLImageOnlyProcessor, "qwen2_5_vl": Qwen2_5_VLImageOnlyProcessor}


def resolve_model_path(model_path: str | Path | None) -> Path:
    """The directory to load: the embedded model when none is given; a clear error when unusable."""
    path = Path(model_path).expanduser() if model_path else embedded_model_path()
    if not path.is_dir():
        raise ModelLoadError(f"model_path {str(path)!r} is not a directory")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model_path {str(path)!r} has no config.json: not a Hugging Face model directory")
    return path


def _first_line(error: Exception) -> str:
    """An error's first line for a one-line reason (its repr when it has no text)."""
    return (str(error).splitlines() or [repr(error)])[0]


def check_supported(path: Path) -> None:
    """One line naming the supported families when config.json names another, read before
    transformers loads gigabytes the engine could not position (or fails on an unknown type)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read {str(path / 'config.json')!r}: {error}") from error
    config = config if isinstance(config, dict) else {}
    family = config.get("model_type")
    if family not in POSITIONS:
        architectures = ", ".join(config.get("architectures") or [])
        raise ModelLoadError(f"model {str(path)!r} is {family!r}{f' ({architectures})' if architectures else ''}; "
                             f"the engine supports {', '.join(sorted(POSITIONS))}")


def load_model_and_processor(model_path: str | Path | None, device: str = "cpu", dtype: str = "float32",
                             attn_implementation: str = "sdpa", quantization: str = "none"):
    """Model in eval mode on `device`, with `attn_implementation` in the language model only.

    `quantization` is one of quantization.MODES or "auto" (see quantization.default_mode).
    """
    path = resolve_model_path(model_path)
    check_supported(path)
    try:
        weights = language_linear_weights(AutoConfig.from_pretrained(path, local_files_only=True))
    except (OSError, ValueError, KeyError, AttributeError) as error:
        raise ModelLoadError(f"cannot read the model config in {str(path)!r}: {_first_line(error)}") from error
    try:
        mode = resolve_mode(quantization, device, weights)
    except QuantizationError as error:
        raise ModelLoadError(str(error)) from None
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available on this machine")
    progress_bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a per-tensor loading bar is noise in a node's log
    try:
        bnb_config = bitsandbytes_config(mode)
        model = AutoModelForImageTextToText.from_pretrained(
            path, local_files_only=True, dtype=DTYPES[dtype], quantization_config=bnb_config,
            # bitsandbytes places weights while loading; a later .to() is not allowed for them
            device_map={"": device} if bnb_config is not None else None,
            attn_implementation={"text_config": attn_implementation, "vision_config": "sdpa"})
        processor_class = _IMAGE_ONLY.get(model.config.model_type, AutoProcessor)
        processor = processor_class.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        # a KeyError's text is only the missing key: name it as such
        reason = f"a file lacks the field {error}" if isinstance(error, KeyError) else _first_line(error)
        raise ModelLoadError(f"cannot load the model in {str(path)!r}: {reason}") from error
    finally:
        if progress_bar_was_on:
            hf_logging.enable_progress_bar()
    if bnb_config is None:
        model = model.to(device)
    if mode == "cpu-int8":
        apply_dynamic_int8(model)
    return model.eval(), processor
