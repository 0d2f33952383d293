"""Tiny random-weight instances of every supported MLLM family, built from configs offline.

They exercise the exact loading and forward code of real checkpoints (save_pretrained, then
AutoModelForImageTextToText / AutoProcessor from the directory) in a fraction of a second.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (CLIPImageProcessorPil, Idefics3Config, Idefics3ForConditionalGeneration,
                          Idefics3ImageProcessorPil, Idefics3Processor, LlavaConfig, LlavaForConditionalGeneration,
                          LlavaProcessor, PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                          Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil)

from infmllm_ros.engine.loading import Qwen2_5_VLImageOnlyProcessor, Qwen2VLImageOnlyProcessor

WORDS = ["<unk>", "<pad>", "<s>", "</s>", "\n", "USER:", "ASSISTANT:", "User:", "Assistant:", "user", "assistant",
         "what", "is", "in", "view", "?", "red", "green", "blue", "circle", "square", "a", "the", "there"]
FAMILIES = ("llava-llama", "llava-qwen2", "qwen2_vl", "qwen2_5_vl", "idefics3")
QWEN_SPECIAL = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>", "<|im_start|>", "<|im_end|>"]
IDEFICS_SPECIAL = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]


def word_tokenizer(special: list[str]) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        bos_token="<s>", eos_token="</s>")
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    return tokenizer


def _text_config(vocab_size: int, **extra) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, **extra)


#: what real checkpoints' processors do to a camera frame (Qwen2-VL-2B-Instruct's pixel limits;
#: SmolVLM-256M's 512 px image of 64 tokens, without its tiling): a 640x480 frame is then ~400
#: (Qwen2-VL) or ~70 (SmolVLM) tokens, where the fast test shapes give a handful
QWEN2_VL_PIXELS = (56 * 56, 28 * 28 * 16384)
SMOLVLM_EDGE, SMOLVLM_IMAGE_TOKENS = 512, 64


def build(family: str, seed: int = 0, real_frame_size: bool = False):
    """(model, processor) of a tiny random instance of `family` (one of FAMILIES); with
    `real_frame_size` its processor turns a frame into as many tokens as the real checkpoint's."""
    torch.manual_seed(seed)
    if family.startswith("llava"):
        tokenizer = word_tokenizer(["<image>"])
        text_type = family.split("-")[1]
        config = LlavaConfig(
            vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14,
                               projection_dim=32),
            text_config=dict(model_type=text_type, **_text_config(len(tokenizer))),
            image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_seq_length=4,
            vision_feature_layer=-2, vision_feature_select_strategy="default")
        processor = LlavaProcessor(
            image_processor=CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
            tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1)
        return LlavaForConditionalGeneration(config).eval(), processor
    if family in ("qwen2_vl", "qwen2_5_vl"):
        tokenizer = word_tokenizer(QWEN_SPECIAL)
        ids = {s: tokenizer.convert_tokens_to_ids(s) for s in QWEN_SPECIAL}
        text = _text_config(len(tokenizer), rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                  mrope_section=[2, 3, 3]))
        tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                      vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
        pixels = QWEN2_VL_PIXELS if real_frame_size else (56 * 56, 56 * 56)
        image_processor = Qwen2VLImageProcessorPil(min_pixels=pixels[0], max_pixels=pixels[1])
        if family == "qwen2_vl":
            config = Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=64,
                                                                        num_heads=2, mlp_ratio=2), **tokens)
            return (Qwen2VLForConditionalGeneration(config).eval(),
                    Qwen2VLImageOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer))
        config = Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
            fullatt_block_indexes=[1], window_size=56), **tokens)
        return (Qwen2_5_VLForConditionalGeneration(config).eval(),
                Qwen2_5_VLImageOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer))
    if family == "idefics3":
        tokenizer = word_tokenizer(IDEFICS_SPECIAL)
        edge, image_tokens, scale = (SMOLVLM_EDGE, SMOLVLM_IMAGE_TOKENS, 4) if real_frame_size else (64, 4, 2)
        config = Idefics3Config(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=edge, patch_size=16),
            text_config=dict(model_type="llama", **_text_config(len(tokenizer))), scale_factor=scale,
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
        processor = Idefics3Processor(
            image_processor=Idefics3ImageProcessorPil(size={"longest_edge": edge},
                                                      max_image_size={"longest_edge": edge}, do_image_splitting=False),
            tokenizer=tokenizer, image_seq_len=image_tokens)
        return Idefics3ForConditionalGeneration(config).eval(), processor
    raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")


def save(family: str, directory: Path, seed: int = 0, real_frame_size: bool = False) -> Path:
    """Build a tiny `family` model and write it as a loadable Hugging Face directory."""
    model, processor = build(family, seed, real_frame_size)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
