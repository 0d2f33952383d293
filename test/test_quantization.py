"""Every quantization mode really swaps the embedded model's linear layers and still sees the scene."""

from __future__ import annotations

import importlib.util
import json

import pytest

from infmllm_ros.engine.loading import ModelLoadError, load_model_and_processor
from infmllm_ros.engine.quantization import default_mode, quantized_linear_count
from infmllm_ros.engine.session import SessionConfig, StreamingSession

from test_embedded_model import accuracy_on_fixed_questions

EXPECTED_LINEAR = {
    "none": "torch.nn.modules.linear.Linear",
    "cpu-int8": "torch.ao.nn.quantized.dynamic.modules.linear.Linear",
    "nf4": "bitsandbytes.nn.modules.Linear4bit",
    "int8": "bitsandbytes.nn.modules.Linear8bitLt",
}
LANGUAGE_LINEARS = 4 * 7   # 4 decoder layers x (q, k, v, o, gate, up, down)


@pytest.mark.parametrize("mode", ["none", "cpu-int8", "nf4", "int8"])
def test_mode_replaces_linear_layers_and_answers(mode):
    session = StreamingSession(SessionConfig(quantization=mode, cache_policy="infmllm"))
    counts = quantized_linear_count(session.model)
    assert counts.get(EXPECTED_LINEAR[mode], 0) >= LANGUAGE_LINEARS, counts
    if mode != "none":
        # the vision tower and projector keep full-precision linears
        assert counts.get("torch.nn.modules.linear.Linear", 0) >= 1
    right, asked, _ = accuracy_on_fixed_questions(session, seeds=range(1, 5))
    print(f"{mode}: {right}/{asked} current-scene answers correct")
    # 8-9 of 16 with every mode (deterministic); chance is about 5 of 16 (see test_embedded_model)
    assert right / asked >= 0.375


def test_defaults_per_device_and_size():
    assert default_mode("cuda") == "nf4" and default_mode("cuda:1", 10**6) == "nf4"
    assert default_mode("cpu", 200_000_000) == "cpu-int8"
    assert default_mode("cpu", 2_359_296) == "none"   # the embedded model: int8 would only cost time
    session = StreamingSession(SessionConfig(quantization="auto"))
    assert EXPECTED_LINEAR["cpu-int8"] not in quantized_linear_count(session.model)


def test_impossible_modes_fail_clearly(monkeypatch):
    with pytest.raises(ModelLoadError, match="runs on device 'cpu' only"):
        load_model_and_processor(None, device="cuda", quantization="cpu-int8")
    with pytest.raises(ModelLoadError, match="not one of"):
        load_model_and_processor(None, quantization="int3")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real_find_spec(name, *a))
    with pytest.raises(ModelLoadError, match="needs bitsandbytes"):
        load_model_and_processor(None, quantization="nf4")


def test_unsupported_architecture_fails_in_one_line_naming_the_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "paligemma",
                                                     "architectures": ["PaliGemmaForConditionalGeneration"]}))
    with pytest.raises(ModelLoadError) as error:
        load_model_and_processor(tmp_path)
    message = str(error.value)
    assert "\n" not in message and "'paligemma'" in message and "PaliGemmaForConditionalGeneration" in message
    for family in ("idefics3", "llava", "qwen2_vl", "qwen2_5_vl"):
        assert family in message
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_model_and_processor(tmp_path)
