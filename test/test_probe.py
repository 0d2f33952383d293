"""Linear probes (tiny_model/probe.py) on the shipped model: real rendered streams, the real tower
and language model; the probe must find a seen-once colour far better than chance."""

from transformers import AutoModelForImageTextToText, AutoTokenizer

from infmllm_ros.engine.loading import resolve_model_path
from infmllm_ros.tiny_model.features import compute_features
from infmllm_ros.tiny_model.probe import probe_representations
from infmllm_ros.tiny_model.streams import render_stream


def test_probes_read_the_tower_and_every_layer_and_find_seen_once_colours():
    model_dir = resolve_model_path(None)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    streams = [render_stream((seed, tokenizer, 90.0)) for seed in (123_401, 123_402, 123_403)]
    for stream in streams:
        compute_features(model, stream)
    rows = probe_representations(model, tokenizer, streams[:2], streams[2:])
    assert len(rows) == model.config.text_config.num_hidden_layers + 1
    assert rows[0]["representation"] == "tower output"
    for row in rows:
        assert 0.0 <= row["patch_shape"] <= 1.0 and row["seen_once_colours"] > 0
    frames_with_object = 10 / 90   # about what picking frames at random would score
    assert rows[0]["patch_colour"] > 0.5 and rows[0]["find_colour"] > 3 * frames_with_object
