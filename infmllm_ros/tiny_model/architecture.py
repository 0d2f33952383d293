"""The embedded model's architecture: a standard LLaVA (CLIP vision tower, MLP projector, Llama).

Nothing here is custom: the saved directory loads with AutoModelForImageTextToText and
AutoProcessor exactly like a LLaVA checkpoint from the hub. Sizes are chosen for CPU training in
under 30 minutes on 2 cores and for cheap long streams: 16 visual tokens per frame.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor,
                          PreTrainedTokenizerFast)

from infmllm_ros.engine.adapters import PROMPT_FILE

IMAGE_SIZE = 64          # the camera frame is squashed to 64x64 (aspect not kept; consistent everywhere)
PATCH_SIZE = 16          # -> 4x4 = 16 visual tokens per frame
GRID = IMAGE_SIZE // PATCH_SIZE
IMAGE_TOKENS = GRID ** 2
#: positions the model is trained on (random offsets and gapped windows reach them): a 10-minute
#: stream at 1 Hz with a question every 3 s is about 12,500 positions under the full cache
MAX_POSITIONS = 16384

SPECIAL_TOKENS = ["<unk>", "<pad>", "</s>", "<image>", "<frame>", "<q>", "<a>"]
# The stream as text: "<frame>" then the frame's 16 image tokens; a question, then its answer
# closed by "</s>". Whole words as tokens: the world's language is a few dozen words.
PROMPT = {"frame": "<frame><image>", "question": "<q> {question} <a>", "stop": []}


def train_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the generator's vocabulary (it has no open-ended text)."""
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="</s>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:]})
    return tokenizer


def build_processor(tokenizer: PreTrainedTokenizerFast) -> LlavaProcessor:
    image_processor = CLIPImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_center_crop=False)
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1)


def build_model(tokenizer: PreTrainedTokenizerFast, vision_width: int = 128, vision_layers: int = 3,
                language_layers: int = 4, rope_theta: float = 10000.0, language_heads: int = 4,
                language_kv_heads: int = 2, language_intermediate: int = 512) -> LlavaForConditionalGeneration:
    """Heads are 64 wide whatever their number, so a model widened by heads (widening.py) keeps the
    trained heads' RoPE frequencies."""
    config = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=vision_width,
                           intermediate_size=2 * vision_width, num_hidden_layers=vision_layers,
                           num_attention_heads=vision_width // 32, image_size=IMAGE_SIZE,
                           patch_size=PATCH_SIZE, projection_dim=vision_width),
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=256,
                         intermediate_size=language_intermediate, num_hidden_layers=language_layers,
                         num_attention_heads=language_heads, num_key_value_heads=language_kv_heads, head_dim=64,
                         max_position_embeddings=MAX_POSITIONS, rope_theta=rope_theta, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_seq_length=IMAGE_TOKENS,
        vision_feature_layer=-1, vision_feature_select_strategy="default",
        projector_hidden_act="gelu", tie_word_embeddings=True)
    return LlavaForConditionalGeneration(config)


def set_attention_factor(text_config, factor: float) -> None:
    """Scale attention logits by factor^2 through the standard YaRN rope type at frequency factor 1:
    RoPE frequencies stay as trained, cos and sin are multiplied by `factor`. A 10-minute stream
    spreads softmax mass over ~12,500 keys where training windows held ~1,500; a sharper softmax
    keeps the few evidence keys in reach (README, "The embedded model"). 1.0 = plain RoPE."""
    theta = text_config.rope_parameters["rope_theta"]
    if factor == 1.0:
        text_config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    else:
        text_config.rope_parameters = {"rope_type": "yarn", "rope_theta": theta, "factor": 1.0,
                                       "attention_factor": factor,
                                       "original_max_position_embeddings": text_config.max_position_embeddings}


def save_model_dir(model, processor, directory: Path, training_record: dict) -> None:
    """Write a complete, self-describing model directory."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    (directory / PROMPT_FILE).write_text(json.dumps(PROMPT, indent=2) + "\n")
    (directory / "training.json").write_text(json.dumps(training_record, indent=2) + "\n")
