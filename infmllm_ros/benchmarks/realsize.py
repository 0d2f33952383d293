"""Realsize suite: the engine on SmolVLM-256M and Qwen2-VL-2B shapes, against what the hardware allows.

Every other suite measures the 3 M embedded model, where Python overhead hides what the engine
costs. This one builds, from configuration alone (random weights, nothing downloaded), model
directories with the layer counts, widths, heads, vocabularies and vision towers of
SmolVLM-256M-Instruct and Qwen2-VL-2B-Instruct, loads them through `model_path` as a user's
checkpoint loads, and measures, per quantization mode: weights, ingest per camera frame, time to
first token after 60 frames, decode ms/token at two contexts for `full`, `infmllm` and
transformers' `generate()` with its DynamicCache (same weights), KV memory after an hour at
1 frame/s, and the floor: the bytes one decoding step must read (language-model weights, output
head, keys and values held) over the machine's measured memory bandwidth.

Contexts are filled with right-shaped random keys and values instead of prefilled through the
model: 8 k tokens through a 1.5 B model would take minutes per cell on 2 cores, and a decoding
step costs what it reads, not what the numbers are. The session's own eviction runs during the
fill, so `infmllm` arrives at 8 k holding its budget. Each model and mode runs in a fresh child
process (its memory figures are its own).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from infmllm_ros.engine.session import SessionConfig, StreamingSession

from .measure import decode_timings, gpu_peak_mb, in_child, rss_mb, synchronize_device
from .quant import model_megabytes, tensor_bytes
from .scale import stream_frames

QUESTION = "what is in view ?"
#: quantization modes: name -> the session settings that make it (the CPU's two by default)
MODES = {"none": {"quantization": "none"}, "cpu-int8": {"quantization": "cpu-int8"}}
#: the same measurements on a CUDA device (benchmarks/gpu.py): bf16 weights, and bitsandbytes nf4
CUDA_MODES = {"bf16": {"device": "cuda", "dtype": "bfloat16", "quantization": "none"},
              "nf4": {"device": "cuda", "dtype": "bfloat16", "quantization": "nf4"}}
RUNNERS = ("full", "infmllm", "generate")
HOUR_FRAMES = 3600   # a simulated hour at 1 frame/s
WARMUP_STEPS = 2     # decoding steps run and not timed before each cell (first-call allocations)
#: Qwen2-VL's pixel cap for ~64 visual tokens a frame (64 merged 28x28 patches): its real limit
#: (28*28*16384) makes a 640x480 frame 396 tokens, and 60 such frames would take the suite far
#: past its 20 minutes on 2 cores
QWEN2_VL_MAX_PIXELS = 64 * 28 * 28


@dataclass(frozen=True)
class Size:
    """How much of the suite to run: `quick` is the smoke size tests run (every code path)."""

    frames: int            # ingested before the timed question
    contexts: tuple[int, ...]
    budget: int            # infmllm cache budget (tokens per layer)
    steps: int | None      # decoding steps timed per cell; None: one eviction chunk from just after an
                           # eviction, so infmllm's mean carries exactly one (its amortised cost)
    quick: bool


FULL_SIZE = Size(frames=60, contexts=(1024, 8192), budget=2048, steps=None, quick=False)
QUICK_SIZE = Size(frames=3, contexts=(256, 1024), budget=512, steps=4, quick=True)


def _shrink(quick: bool, layers: int) -> int:
    return 2 if quick else layers


def smolvlm_256m(quick: bool):
    """(model, processor): SmolVLM-256M-Instruct's shapes (Idefics3: SmolLM2-135M, 30 layers of 576,
    9 heads / 3 KV; SigLIP base 512 px, patch 16, 12 layers of 768; pixel shuffle 4 -> 64 tokens),
    one 512 px image a frame (the real processor also tiles large images; a robot frame need not)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil, Idefics3Processor

    from infmllm_ros.testing.tiny_models import IDEFICS_SPECIAL, SMOLVLM_EDGE, SMOLVLM_IMAGE_TOKENS, word_tokenizer
    tokenizer = word_tokenizer(IDEFICS_SPECIAL)
    config = Idefics3Config(
        text_config=dict(model_type="llama", vocab_size=4096 if quick else 49280, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=_shrink(quick, 30), num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_parameters=dict(rope_type="default", rope_theta=100000.0), tie_word_embeddings=False),
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=1 if quick else 12,
                           num_attention_heads=12, image_size=SMOLVLM_EDGE, patch_size=16),
        scale_factor=4, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=False)
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(size={"longest_edge": SMOLVLM_EDGE},
                                                  max_image_size={"longest_edge": SMOLVLM_EDGE},
                                                  do_image_splitting=False),
        tokenizer=tokenizer, image_seq_len=SMOLVLM_IMAGE_TOKENS)
    return Idefics3ForConditionalGeneration(config), processor


def qwen2_vl_2b(quick: bool):
    """(model, processor): Qwen2-VL-2B-Instruct's shapes (28 layers of 1536, 12 heads / 2 KV,
    MLP 8960, vocabulary 151,936 tied to the output head, M-RoPE [16, 24, 24]; ViT of 32 layers of
    1280, 16 heads, patch 14, 2x2 merge), pixels capped at QWEN2_VL_MAX_PIXELS."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    from infmllm_ros.engine.loading import Qwen2VLImageOnlyProcessor
    from infmllm_ros.testing.tiny_models import QWEN_SPECIAL, word_tokenizer
    tokenizer = word_tokenizer(QWEN_SPECIAL)
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in QWEN_SPECIAL}
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=4096 if quick else 151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=_shrink(quick, 28), num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         rope_parameters=dict(rope_type="default", rope_theta=1000000.0, mrope_section=[16, 24, 24])),
        vision_config=dict(depth=1 if quick else 32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        tie_word_embeddings=True, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    processor = Qwen2VLImageOnlyProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=QWEN2_VL_MAX_PIXELS),
        tokenizer=tokenizer)
    return Qwen2VLForConditionalGeneration(config), processor


MODELS = {"SmolVLM-256M": smolvlm_256m, "Qwen2-VL-2B": qwen2_vl_2b}


def model_directory(name: str, cache_dir: Path, quick: bool) -> Path:
    """The model written once as a bf16 checkpoint (as published) under cache_dir, reused after."""
    directory = cache_dir / f"{name}{'-quick' if quick else ''}"
    if (directory / "model.safetensors.index.json").exists() or (directory / "model.safetensors").exists():
        return directory
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)   # half the memory and time of building 2 B weights
    try:
        model, processor = MODELS[name](quick)
    finally:
        torch.set_default_dtype(default)
    partial = directory.with_name(directory.name + ".partial")
    model.save_pretrained(partial)
    processor.save_pretrained(partial)
    partial.rename(directory)
    return directory


def memory_bandwidth(megabytes: int = 1024, repeats: int = 5, device: str = "cpu") -> dict:
    """The memory bandwidth in GB/s of `device` (the host's with torch's threads, or a GPU's):
    reading (a sum over a buffer far larger than any cache: what a decoding step does to its
    weights) and copying."""
    source = torch.ones(megabytes * 2**20 // 4, device=device)
    target = torch.empty_like(source)

    def seconds(operation) -> float:
        synchronize_device(device)
        started = time.perf_counter()
        operation()
        synchronize_device(device)
        return time.perf_counter() - started

    read = [seconds(source.sum) for _ in range(repeats)]
    copy = [seconds(lambda: target.copy_(source)) for _ in range(repeats)]
    size = source.numel() * 4
    return {"read_gbs": size / min(read) / 1e9, "copy_gbs": 2 * size / min(copy) / 1e9, "buffer_mb": megabytes,
            "device": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"}


def decode_weight_bytes(model) -> int:
    """Bytes one decoding step reads of the weights: every decoder layer, the final norm and the
    whole output head (a tied head is the embedding table, read in full; one embedding row is not
    worth counting). The vision tower and projector do not run while decoding."""
    text = model.get_decoder()
    total = sum(tensor_bytes(v) for k, v in text.state_dict().items() if not k.startswith("embed_tokens"))
    return total + tensor_bytes(model.get_output_embeddings().weight)


LINEAR_REPEATS = 5   # passes over the decoder's linear layers; the fastest is kept


def read_ms(nbytes: int, bandwidth_gbs: float) -> float:
    """Milliseconds to read `nbytes` at the measured bandwidth: the floor of whatever must read them."""
    return 1000 * nbytes / (bandwidth_gbs * 1e9)


def linear_kernels_ms(model, repeats: int = LINEAR_REPEATS) -> float:
    """What PyTorch's own kernels take to read a decoding step's weights: every linear layer of the
    decoder (fp32 or dynamic int8, as loaded) and the output head, each called on one token in turn,
    with no attention, norms or Python of the layers around them. The gap between this and the
    bandwidth floor is the kernels'; the gap between this and a decoding step is the model's code
    and the engine's."""
    quantized = getattr(torch.ao.nn.quantized.dynamic, "Linear", ())
    linears = [module for module in model.get_decoder().layers.modules()
               if isinstance(module, (torch.nn.Linear, quantized))]
    linears.append(model.get_output_embeddings())
    weight = next(model.get_decoder().parameters())
    device, dtype = weight.device, weight.dtype
    inputs = {module.in_features: torch.randn(1, 1, module.in_features, device=device, dtype=dtype)
              for module in linears}
    passes = []
    with torch.inference_mode():
        for _ in range(repeats + 1):   # the first pass warms up and is not kept
            synchronize_device(device)
            started = time.perf_counter()
            for module in linears:
                module(inputs[module.in_features])
            synchronize_device(device)
            passes.append(time.perf_counter() - started)
    return 1000 * min(passes[1:])


def kv_shape(model) -> tuple[int, int, int, torch.dtype]:
    """(layers, KV heads, head dim, dtype) of the model's keys and values."""
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    dtype = next(model.get_decoder().parameters()).dtype
    return text.num_hidden_layers, text.num_key_value_heads, head_dim, dtype


def fill_session(session: StreamingSession, tokens: int, piece: int) -> None:
    """Append `tokens` tokens of right-shaped random keys and values, and random attention mass, to
    the session's cache in pieces, through the cache's own verbs (eviction and re-indexing run
    as in a stream), without running the model."""
    layers, heads, head_dim, dtype = kv_shape(session.model)
    device = session.device
    token = torch.tensor([[session.tokenizer.pad_token_id or 0]])
    for start in range(0, tokens, piece):
        count = min(piece, tokens - start)
        session.cache.admit({"input_ids": token.expand(1, count)})
        for index, layer in enumerate(session.cache.layers):
            layer.update(torch.randn(1, heads, count, head_dim, dtype=dtype, device=device),
                         torch.randn(1, heads, count, head_dim, dtype=dtype, device=device))
            session.cache.add_attention_mass(index, torch.rand(heads, layer.length, device=device))


def filled_dynamic_cache(model, tokens: int):
    """transformers' DynamicCache holding `tokens` right-shaped random keys and values."""
    from transformers import DynamicCache
    layers, heads, head_dim, dtype = kv_shape(model)
    device = model.device
    cache = DynamicCache(config=model.config)
    for layer in range(layers):
        cache.update(torch.randn(1, heads, tokens, head_dim, dtype=dtype, device=device),
                     torch.randn(1, heads, tokens, head_dim, dtype=dtype, device=device), layer)
    return cache


def kv_bytes(session: StreamingSession) -> int:
    """Keys and values held (what a decoding step reads of the cache; bookkeeping apart)."""
    return sum(tensor_bytes(layer.keys) + tensor_bytes(layer.values) for layer in session.cache.layers
               if layer.keys is not None)


def generate_ms_per_token(model, context: int, steps: int) -> float:
    """What a user would run instead: generate() on a DynamicCache holding `context` tokens,
    greedy, with transformers' SDPA attention; per-token cost = (steps + 1 tokens - 1 token) /
    steps, so setup is not counted."""
    # The sessions measured before share this model and leave their attention set (the scoring
    # one for infmllm): without this, generate() would pay for attention mass nobody reads.
    model.set_attn_implementation({"text_config": "sdpa", "vision_config": "sdpa"})
    ids = torch.full((1, context + 1), 5, device=model.device)
    seconds = {}
    for new in (1, 1, steps + 1):   # the first call warms up (allocator, kernels) and is not kept
        cache = filled_dynamic_cache(model, context)
        synchronize_device(model.device)
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                           max_new_tokens=new, min_new_tokens=new, do_sample=False)
        synchronize_device(model.device)
        seconds[new] = time.perf_counter() - started
        del cache
    return 1000 * (seconds[steps + 1] - seconds[1]) / steps


def measure_model(directory: str, name: str, mode: str, overrides: dict, size: Size, bandwidth_gbs: float) -> dict:
    """Every figure of one model in one quantization mode (`overrides`: its session settings; run
    in a child process)."""
    rss_start = rss_mb()
    overrides = {"recall_store_mb": 0.0, **overrides}   # the policies' own figures: recall is not measured here
    session = StreamingSession(SessionConfig(model_path=directory, cache_policy="infmllm", cache_budget=size.budget,
                                             **overrides))
    model, processor = session.model, session.processor
    steps = size.steps or session.policy.chunk
    weight_bytes = decode_weight_bytes(model)
    summary = {"model": name, "mode": mode, "weights_mb": model_megabytes(model), "decode_steps": steps,
               "decode_weights_mb": weight_bytes / 2**20, "frame_tokens": session.frame_tokens,
               "rss_loaded_mb": rss_mb(), "rss_start_mb": rss_start}
    ingest = [session.add_frame(frame, stamp=float(i)).seconds
              for i, frame in enumerate(tqdm(stream_frames(size.frames), desc=f"{name} {mode} frames", leave=False))]
    answer = session.ask(QUESTION, max_new_tokens=1)
    summary.update(ingest_ms=1000 * statistics.median(ingest), ttft_ms=1000 * answer.ttft_s,
                   ttft_context=answer.cache_tokens)
    linears_ms = linear_kernels_ms(model)
    weights_floor_ms = read_ms(weight_bytes, bandwidth_gbs)
    summary.update(linears_ms=linears_ms, weights_floor_ms=weights_floor_ms,
                   linears_of_floor_pct=100 * weights_floor_ms / linears_ms)
    cells = []
    for runner in RUNNERS:
        for context in size.contexts:
            cell = {"model": name, "mode": mode, "runner": runner, "context": context}
            if runner == "generate":
                cell["decode_ms"] = generate_ms_per_token(model, context, steps)
                cell["cache_tokens"] = context
                layers, heads, head_dim, dtype = kv_shape(model)
                held = 2 * layers * heads * head_dim * context * dtype.itemsize
                cell["kv_mb"] = held / 2**20
            else:
                policy = StreamingSession(SessionConfig(model_path=directory, cache_policy=runner,
                                                        cache_budget=size.budget, **overrides),
                                          model=model, processor=processor)
                fill_session(policy, context, piece=policy.policy.chunk if runner != "full" else 512)
                decode_timings(policy, WARMUP_STEPS)
                if size.steps is None and runner != "full" and context > size.budget:
                    evictions = policy.cache.evictions   # start the timed steps right after an eviction
                    while policy.cache.evictions == evictions:
                        decode_timings(policy, 1)
                evicting = policy.cache.eviction_seconds
                timings = decode_timings(policy, steps)
                held = kv_bytes(policy)
                cell.update(decode_ms=1000 * statistics.mean(timings), decode_p50_ms=1000 * statistics.median(timings),
                            eviction_ms=1000 * (policy.cache.eviction_seconds - evicting) / steps,
                            cache_tokens=policy.cache_tokens, kv_mb=held / 2**20,
                            reserved_mb=policy.cache_bytes / 2**20)
                del policy
            cell["attention"] = model.config.get_text_config()._attn_implementation   # what the step ran
            cell["floor_ms"] = read_ms(weight_bytes + held, bandwidth_gbs)
            cell["of_floor_pct"] = 100 * cell["floor_ms"] / cell["decode_ms"]
            cell["linears_share_pct"] = 100 * linears_ms / cell["decode_ms"]   # of the step: the weights' kernels
            cell["rss_mb"] = rss_mb()
            cell["gpu_peak_mb"] = gpu_peak_mb(session)
            cells.append(cell)
    summary.update(hour_kv(cells, size, session.frame_tokens))
    return {"summary": summary, "cells": cells}


def hour_kv(cells: list[dict], size: Size, frame_tokens: int) -> dict:
    """Keys and values (MB) after HOUR_FRAMES frames: `full` grows linearly (extrapolated from its
    largest measured context: marked), `infmllm` never holds more than its budget plus one chunk
    (measured; its reserved storage is budget + chunk from the first token)."""
    longest = max(size.contexts)
    full = next(c for c in cells if c["runner"] == "full" and c["context"] == longest)
    bounded = next(c for c in cells if c["runner"] == "infmllm" and c["context"] == longest)
    hour_tokens = HOUR_FRAMES * frame_tokens
    return {"hour_tokens": hour_tokens,
            "hour_kv_full_mb": f"{full['kv_mb'] / full['cache_tokens'] * hour_tokens:,.0f} (extrapolated)",
            "hour_kv_infmllm_mb": f"{bounded['kv_mb']:,.1f} (measured at {longest:,})"}


def available_mb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def needed_mb(directory: Path, size: Size) -> float:
    """Peak estimate: fp32 weights (loaded, then quantized in place) plus the largest full cache, doubled
    for generate()'s copy, plus a gigabyte of runtime."""
    config = json.loads((directory / "config.json").read_text())
    index = directory / "model.safetensors.index.json"
    stored = (json.loads(index.read_text())["metadata"]["total_size"] if index.exists()
              else (directory / "model.safetensors").stat().st_size)
    text = config.get("text_config", config)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    kv = 2 * text["num_hidden_layers"] * text["num_key_value_heads"] * head_dim * 4 * max(size.contexts)
    return (2 * stored + 2 * kv) / 2**20 + 1024   # bf16 on disk -> fp32 in memory


def run_realsize(cache_dir: Path, size: Size, models=tuple(MODELS), modes=MODES) -> dict:
    """Every model in every mode; the floor is the bandwidth of the memory the weights sit in (the
    GPU's when the modes run on CUDA)."""
    device = next(iter(modes.values())).get("device", "cpu")
    bandwidth = memory_bandwidth(256 if size.quick else 1024, device=device)
    summaries, cells = [], []
    for name in tqdm(models, desc="realsize models", unit="model"):
        directory = model_directory(name, cache_dir / "realsize", size.quick)
        for mode, overrides in modes.items():
            need, have = needed_mb(directory, size), available_mb()
            if device == "cpu" and need > have:   # host memory; a GPU's 80 GB holds these models
                summaries.append({"model": name, "mode": mode,
                                  "skipped": f"needs ~{need:,.0f} MB, {have:,.0f} MB available"})
                continue
            result = in_child(measure_model, str(directory), name, mode, overrides, size, bandwidth["read_gbs"])
            summaries.append(result["summary"])
            cells += result["cells"]
    return {"bandwidth": bandwidth, "summaries": summaries, "cells": cells}


def realsize_plot(name: str, cells: list[dict], directory: Path) -> Path:
    """ms/token against context, one panel per model and mode, one line per runner; the floor
    of the bytes each reads dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((c["model"], c["mode"]) for c in cells))
    figure, axes = plt.subplots(1, max(len(panels), 1), figsize=(4.4 * max(len(panels), 1), 3.6), squeeze=False)
    for axis, (model, mode) in zip(axes[0], panels):
        for runner in RUNNERS:
            points = sorted((c["context"], c["decode_ms"], c["floor_ms"]) for c in cells
                            if (c["model"], c["mode"], c["runner"]) == (model, mode, runner))
            if not points:
                continue
            line = axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=runner)[0]
            axis.plot([p[0] for p in points], [p[2] for p in points], linestyle="--", color=line.get_color(),
                      alpha=0.7)
        axis.set(title=f"{model} ({mode})", xlabel="context (tokens)", ylabel="decode ms/token", xscale="log")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.text(0.5, 0.005, "dashed: floor (bytes read per token / measured memory bandwidth)", ha="center",
                fontsize=8)
    figure.tight_layout()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
