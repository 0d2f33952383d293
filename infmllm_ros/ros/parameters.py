"""The node's parameters, declared once: name, type, default, description, validator, and whether they
can change while the node runs.

Plain Python (no rclpy) so the table can be checked against config/infmllm.yaml and the engine's
SessionConfig without DDS. Parameters that shape the model or the cache, and the topics, are
configure-time (`read_only`): they are read by the lifecycle `configure` transition and may be
changed only while the node is unconfigured (cleanup, set, configure again), since changing them
means reloading the model or resubscribing. The rest (rates, limits) apply at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

# The engine's choices, restated so that reading this table does not import torch
# (test_ros_conversion checks they still match the engine).
CACHE_POLICIES = ("full", "streaming", "h2o", "infmllm")
DTYPES = ("float32", "float16", "bfloat16")
IMAGE_QOS = ("sensor_data", "reliable")
PRUNE_UNITS = ("token", "frame")
# The engine's quantization modes (engine/quantization.py) plus "auto" (nf4 on CUDA, cpu-int8 on CPU).
QUANTIZATION = ("none", "nf4", "int8", "cpu-int8", "auto")
NOT_YET_SUPPORTED_QUANTIZATION = ("8bit", "int4", "4bit", "fp8", "awq", "gptq")
# Parameters copied one to one into the engine's SessionConfig.
SESSION_FIELDS = ("model_path", "device", "dtype", "quantization", "cache_policy", "cache_budget", "recent_window",
                  "eviction_chunk", "sink_tokens", "attention_bias", "saddle_pool", "max_new_tokens", "recall_store_mb",
                  "recall_frames", "prune_similarity", "prune_unit")

Validator = Callable[[Any], "str | None"]  # an error message, or None when the value is fine


@dataclass(frozen=True)
class ParameterSpec:
    name: str
    type: str            # "string" | "integer" | "double" | "boolean" | "string_array"
    default: Any
    description: str
    validate: Validator
    read_only: bool = True


class ParameterError(ValueError):
    """A parameter value the node refuses; the message names the parameter."""


# ---- validators ---------------------------------------------------------------------------------

def one_of(choices: Iterable[str]) -> Validator:
    choices = tuple(choices)
    return lambda value: None if value in choices else f"must be one of {list(choices)}, not {value!r}"


def in_range(low: float, high: float, low_open: bool = False) -> Validator:
    def check(value):
        too_low = value <= low if low_open else value < low
        if too_low or value > high:
            return f"must be in {'(' if low_open else '['}{low}, {high}], not {value!r}"
        return None
    return check


#: recall_store_mb's auto value and what it means under a bounded policy: the engine's RECALL_AUTO and
#: DEFAULT_RECALL_STORE_MB, repeated so that reading parameters needs no torch (a test holds them equal)
RECALL_AUTO, DEFAULT_RECALL_STORE_MB = -1.0, 64.0


def _odd_pool(value: int) -> str | None:
    return None if 1 <= value <= 1023 and value % 2 == 1 else f"must be an odd number in [1, 1023], not {value!r}"


def _recall_store_mb(value: float) -> str | None:
    if value == RECALL_AUTO:
        return None
    return in_range(0.0, 1_000_000.0)(value) and f"must be {RECALL_AUTO:g} (auto) or in [0.0, 1000000.0], not {value!r}"


def _model_path(value: str) -> str | None:
    # Checked here (cheaply, before the model loads) so a typo fails in a second; the engine
    # checks the directory's contents when it loads.
    if value and not Path(value).expanduser().is_dir():
        return f"{value!r} is not a directory ('' selects the embedded model)"
    return None


def _device(value: str) -> str | None:
    if re.fullmatch(r"cpu|cuda(:\d+)?", value):
        return None
    return f"must be 'cpu', 'cuda' or 'cuda:N', not {value!r}"


def _quantization(value: str) -> str | None:
    # Whether a mode can run here (bitsandbytes installed, CUDA for nf4/int8) is the engine's check,
    # at load: one clear line from the node instead of a failure deep inside transformers.
    if value in QUANTIZATION:
        return None
    if value.lower() in NOT_YET_SUPPORTED_QUANTIZATION:
        return f"{value!r} is not yet supported; choose one of {list(QUANTIZATION)}"
    return f"must be one of {list(QUANTIZATION)}, not {value!r}"


def _topics(value: list[str]) -> str | None:
    for topic in value:
        if not re.fullmatch(r"/?[A-Za-z_~{][A-Za-z0-9_/{}~]*", topic) or "//" in topic or topic.endswith("/"):
            return f"{topic!r} is not a valid topic name"
    if len(set(value)) != len(value):
        return "lists a topic twice"
    return None


PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec("model_path", "string", "", "Hugging Face model directory; '' = the embedded tiny model",
                  _model_path),
    ParameterSpec("device", "string", "cpu", "torch device: cpu, cuda or cuda:N", _device),
    ParameterSpec("dtype", "string", "float32", "weights and activations dtype", one_of(DTYPES)),
    ParameterSpec("quantization", "string", "auto", "weight quantization: none, nf4 or int8 (bitsandbytes), "
                  "cpu-int8 (CPU), auto (nf4 on CUDA; cpu-int8 on CPU from 20M language weights, else none)",
                  _quantization),
    ParameterSpec("torch_threads", "integer", 0, "CPU threads torch may use; 0 = auto: all cores but one, so "
                  "the executor, DDS and image decoding keep a core (on 2 busy cores, torch on all of them made "
                  "a frame's ingest 870 ms against 29 ms with one thread)", in_range(0, 1024)),
    ParameterSpec("cache_policy", "string", "infmllm", "KV cache policy: full, streaming, h2o or infmllm",
                  one_of(CACHE_POLICIES)),
    ParameterSpec("cache_budget", "integer", 0, "tokens kept per layer after an eviction; 0 = auto: 16 frames "
                  "of the model (at least 1,024 tokens)", in_range(0, 1_000_000)),
    ParameterSpec("recent_window", "integer", 0, "newest tokens always kept (infmllm, h2o); 0 = auto: 4 frames "
                  "(at least 256 tokens)", in_range(0, 1_000_000)),
    ParameterSpec("eviction_chunk", "integer", 0, "tokens the cache may grow past the budget before evicting; "
                  "must hold one frame; 0 = auto: one frame (at least 64 tokens)", in_range(0, 1_000_000)),
    ParameterSpec("sink_tokens", "integer", 4, "first tokens always kept (streaming, infmllm)",
                  in_range(0, 1_000_000)),
    ParameterSpec("attention_bias", "double", 0.2, "infmllm: share of attention-saddle evidence forgotten "
                  "per eviction", in_range(0.0, 1.0)),
    ParameterSpec("saddle_pool", "integer", 1, "infmllm: keys (odd) whose attention is summed into each key's "
                  "saddle score, so a cluster survives together; 1 = each key on its own", _odd_pool),
    ParameterSpec("recall_store_mb", "double", RECALL_AUTO, "recall: host memory (MB, per camera) for frames "
                  "the policy evicted, oldest leaving first; each question gets the recall_frames that best match "
                  f"it back for its answer; 0 = off; {RECALL_AUTO:g} = auto: {DEFAULT_RECALL_STORE_MB:g} MB under a "
                  "bounded policy, off under cache_policy full (which evicts nothing)", _recall_store_mb),
    ParameterSpec("recall_frames", "integer", 4, "recall: stored frames put back for each answer",
                  in_range(0, 1024)),
    ParameterSpec("prune_similarity", "double", 0.0, "temporal pruning: a frame's visual tokens at least this "
                  "cosine-similar to what their patch last appended are left out (a static camera repeats "
                  "itself); 0 = off", in_range(0.0, 1.0)),
    ParameterSpec("prune_unit", "string", "token", "temporal pruning: token (each repeated patch left out) or "
                  "frame (a frame left out whole when none of its patches changed, else appended whole)",
                  one_of(PRUNE_UNITS)),
    ParameterSpec("frame_rate_hz", "double", 1.0, "frames per second of camera time (header stamps) fed to "
                  "the model, per camera, so a bag replayed at any speed feeds the same frames (the embedded "
                  "model was trained at 1 Hz)", in_range(0.0, 100.0, low_open=True), read_only=False),
    ParameterSpec("max_new_tokens", "integer", 16, "longest answer, in tokens", in_range(1, 8192),
                  read_only=False),
    ParameterSpec("query_queue_size", "integer", 8, "questions that may wait; more are refused as busy",
                  in_range(1, 10_000), read_only=False),
    ParameterSpec("max_query_chars", "integer", 2000, "longest accepted question, in characters",
                  in_range(1, 1_000_000), read_only=False),
    ParameterSpec("image_topics", "string_array", ["/camera/image_raw"], "sensor_msgs/Image topics, one "
                  "camera each", _topics),
    ParameterSpec("compressed_image_topics", "string_array", [], "sensor_msgs/CompressedImage (JPEG/PNG) "
                  "topics, one camera each", _topics),
    ParameterSpec("image_qos", "string", "sensor_data", "camera subscription QoS: sensor_data (best effort) "
                  "or reliable", one_of(IMAGE_QOS)),
    ParameterSpec("max_image_pixels", "integer", 3840 * 2160, "larger images are rejected before decoding",
                  in_range(1, 1 << 31), read_only=False),
    ParameterSpec("autostart", "boolean", True, "walk the lifecycle to active at start (configure, then "
                  "activate); false leaves the node unconfigured for a lifecycle manager", lambda value: None),
    ParameterSpec("slow_work_factor", "double", 5.0, "a frame or answer taking more than this many times the "
                  "median of its kind is logged with where its time went (queued, computing, garbage collection, "
                  "waiting to run) and listed in ~/stats slow_work; 0 = never", in_range(0.0, 1000.0),
                  read_only=False),
    ParameterSpec("stats_period_s", "double", 1.0, "seconds between ~/stats messages",
                  in_range(0.0, 3600.0, low_open=True), read_only=False),
)
BY_NAME: dict[str, ParameterSpec] = {spec.name: spec for spec in PARAMETERS}

_PYTHON_TYPES = {"string": (str,), "integer": (int,), "double": (float, int), "boolean": (bool,),
                 "string_array": (list, tuple)}


def check(name: str, value: Any) -> Any:
    """The value, normalised (ints for doubles become floats); ParameterError when it is refused."""
    spec = BY_NAME.get(name)
    if spec is None:
        raise ParameterError(f"unknown parameter {name!r}")
    if spec.type == "string_array" and value is None:
        value = []  # ROS YAML cannot type an empty list: `[]` arrives as "not set"
    if not isinstance(value, _PYTHON_TYPES[spec.type]) or (isinstance(value, bool) and spec.type != "boolean"):
        raise ParameterError(f"{name}: expected {spec.type}, got {value!r}")
    if spec.type == "double":
        value = float(value)
    if spec.type == "string_array":
        value = list(value)
        if not all(isinstance(item, str) for item in value):
            raise ParameterError(f"{name}: expected a list of strings, got {value!r}")
    error = spec.validate(value)
    if error:
        raise ParameterError(f"{name}: {error}")
    return value


def check_all(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter checked (defaults for missing ones), plus the rules that span two of them."""
    checked = {spec.name: check(spec.name, values.get(spec.name, spec.default)) for spec in PARAMETERS}
    if not checked["image_topics"] and not checked["compressed_image_topics"]:
        raise ParameterError("image_topics and compressed_image_topics are both empty: no camera to watch")
    overlap = set(checked["image_topics"]) & set(checked["compressed_image_topics"])
    if overlap:
        raise ParameterError(f"{sorted(overlap)} listed as both a raw and a compressed image topic")
    if checked["recall_store_mb"] > 0 and checked["cache_policy"] == "full":
        raise ParameterError(f"recall_store_mb: recall brings back evicted frames and cache_policy full evicts none; "
                             f"set it to 0.0 or {RECALL_AUTO:g} (auto), or choose a bounded cache_policy")
    return checked


def defaults() -> dict[str, Any]:
    return {spec.name: spec.default for spec in PARAMETERS}


def session_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the engine's SessionConfig ('' model_path means the embedded model)."""
    settings = {name: values[name] for name in SESSION_FIELDS}
    settings["model_path"] = settings["model_path"] or None
    return settings
