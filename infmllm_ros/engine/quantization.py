"""Weight quantization modes, each mapped to the library that does it well.

- `nf4`: bitsandbytes 4-bit NormalFloat with double quantisation, bf16 compute (the robot GPU mode).
- `int8`: bitsandbytes LLM.int8().
- `cpu-int8`: PyTorch's dynamic int8 (`quantize_dynamic`): per-row int8 weights, activations
  quantised on the fly; the fastest CPU path measured (`infmllm-bench --suite realsize`, latest run in
  bench/figures/realsize_dec07b.json: infmllm decode 108 vs 239 ms/token fp32 on the Qwen2-VL-2B shape at
  8 k context, 41 vs 50 on SmolVLM-256M's).
- `none`: weights as stored, in the session's dtype.

The vision tower, the projector and the output head stay in higher precision unless the user
asks otherwise: they are a small share of the weights but most sensitive to rounding.
"""

from __future__ import annotations

import importlib.util

import torch

MODES = ("none", "nf4", "int8", "cpu-int8")
KEEP_PRECISE = ("vision_tower", "visual", "vision_model", "multi_modal_projector", "connector", "lm_head")


class QuantizationError(ValueError):
    """A mode that cannot run here, said before transformers fails somewhere deep."""


# Below this many language-model linear weights, dynamic int8 costs more than it saves on CPU. It sits
# between two measured points: on the 3 M embedded model int8 was slower than fp32 (the quant suite),
# on SmolVLM-256M's shape (106 M) 1.2-1.4x faster and on Qwen2-VL-2B's (1.3 B) 2.2-2.3x (realsize suite,
# bench/figures/realsize_dec07b.json; earlier runs, on other machines, level to 1.6x and 1.9-3.3x).
CPU_INT8_MIN_WEIGHTS = 20_000_000


def default_mode(device: str, language_weights: int | None = None) -> str:
    """`auto`: nf4 on CUDA (4-bit weights fit small robot GPUs); on CPU PyTorch dynamic int8 for
    models large enough to be bound by weight reads, none for tiny ones."""
    if device.startswith("cuda"):
        return "nf4"
    if language_weights is not None and language_weights < CPU_INT8_MIN_WEIGHTS:
        return "none"
    return "cpu-int8"


def language_linear_weights(config) -> int:
    """Weights in the language model's linear layers, estimated from its config (before loading)."""
    text = config.get_text_config()
    hidden, layers = text.hidden_size, text.num_hidden_layers
    head_dim = getattr(text, "head_dim", None) or hidden // text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    attention = hidden * head_dim * (2 * text.num_attention_heads + 2 * kv)
    return layers * (attention + 3 * hidden * text.intermediate_size)


def resolve_mode(mode: str, device: str, language_weights: int | None = None) -> str:
    mode = default_mode(device, language_weights) if mode == "auto" else mode
    if mode not in MODES:
        raise QuantizationError(f"quantization {mode!r} is not one of {['auto', *MODES]}")
    if mode in ("nf4", "int8") and importlib.util.find_spec("bitsandbytes") is None:
        raise QuantizationError(f"quantization {mode!r} needs bitsandbytes: pip install bitsandbytes")
    if mode == "cpu-int8" and not device.startswith("cpu"):
        raise QuantizationError("quantization 'cpu-int8' runs on device 'cpu' only; use 'nf4' or 'int8' on CUDA")
    return mode


def bitsandbytes_config(mode: str, keep_precise: tuple[str, ...] = KEEP_PRECISE):
    """The from_pretrained `quantization_config` for a bitsandbytes mode, else None."""
    if mode not in ("nf4", "int8"):
        return None
    from transformers import BitsAndBytesConfig
    # transformers matches skip patterns from the start of a module's full name (or as a suffix),
    # so "vision_tower" alone would not match "model.vision_tower.encoder...": anchor at any depth.
    keep_precise = [rf"(?:.*\.)?{name}" for name in keep_precise]
    if mode == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules=keep_precise)
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=keep_precise)


def apply_dynamic_int8(model, keep_precise: tuple[str, ...] = KEEP_PRECISE):
    """Replace the language model's nn.Linear layers by dynamic-int8 ones, in place."""
    from torch.ao.quantization import quantize_dynamic
    targets = {name for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and not any(part in name for part in keep_precise)}
    return quantize_dynamic(model, qconfig_spec=targets, dtype=torch.qint8, inplace=True)


def quantized_linear_count(model) -> dict[str, int]:
    """How many linear layers of each implementation a model holds (tests check types, not flags)."""
    counts: dict[str, int] = {}
    for module in model.modules():
        name = type(module).__module__ + "." + type(module).__name__
        if "Linear" in type(module).__name__:
            counts[name] = counts.get(name, 0) + 1
    return counts
