"""Where the answering token of a current-scene lookup looks when two or three objects are in view:
per layer and head, the attention mass on the asked object's patches in the newest frame and on
the other objects' patches, split by question kind and by whether the answer (teacher forced,
argmax) is right. A head keyed by the question puts clearly more on the asked object.

Streams: the 20 short validation episodes of infmllm-train-tiny (64 s, seeds from 90,100), whole,
with the stream's own questions; positions and RoPE as in training (attention factor 1).

usage (from the repository root): python bench/figures/binding/attention_on_objects.py MODEL_DIR [MODEL_DIR ...]"""
import copy
import sys
from collections import Counter

import torch
from transformers import AutoModelForImageTextToText, AutoTokenizer

from infmllm_ros.tiny_model.architecture import set_attention_factor
from infmllm_ros.tiny_model.data import Window, build_sequence
from infmllm_ros.tiny_model.evidence import object_patches
from infmllm_ros.tiny_model.features import compute_features, language_model_loss
from infmllm_ros.tiny_model.retrieval import probing, use_probe_attention
from infmllm_ros.tiny_model.streams import render_streams
from infmllm_ros.tiny_model.train import SHORT_VALIDATION_SECONDS, SHORT_VALIDATION_SEED_BASE

LOOKUPS = {"what colour is": "colour_of_shape", "what shape is": "shape_of_colour"}


def trained_positions(path: str):
    """The model as training runs it: plain RoPE (the saved attention factor is for long streams)."""
    model = AutoModelForImageTextToText.from_pretrained(path)
    set_attention_factor(model.config.text_config, 1.0)
    model = AutoModelForImageTextToText.from_pretrained(path, config=model.config).eval()
    use_probe_attention(model)
    return model


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    streams = render_streams([SHORT_VALIDATION_SEED_BASE + i for i in range(20)], SHORT_VALIDATION_SECONDS, tokenizer)
    image, ask = tokenizer.convert_tokens_to_ids("<image>"), tokenizer.convert_tokens_to_ids("<q>")
    for path in sys.argv[1:]:
        model = trained_positions(path)
        layers = range(model.config.text_config.num_hidden_layers)
        heads = model.config.text_config.num_attention_heads
        mass, count = {}, Counter()
        for rendered in streams:
            stream = copy.copy(rendered)   # compute_features drops the pixels: keep them for the next model
            compute_features(model, stream)
            window = Window([(0, len(stream.frame_times))])
            batch = build_sequence(stream, window, tokenizer, object_evidence=True)
            ids = batch["input_ids"][0].tolist()
            with torch.inference_mode(), probing(batch["retrieval_rows"], layers) as probe:
                logits = language_model_loss(model, batch, logits=True)[0]
            frame_starts = [i for i in range(1, len(ids)) if ids[i] == image and ids[i - 1] != image]
            for number, (row, family, asked) in enumerate(zip(batch["retrieval_rows"], batch["retrieval_families"],
                                                               batch["retrieval_evidence"])):
                question = tokenizer.decode(ids[max(i for i in range(row) if ids[i] == ask):row])
                kind = next((k for prefix, k in LOOKUPS.items() if prefix in question), None)
                first = max(start for start in frame_starts if start < row)
                objects = stream.objects[frame_starts.index(first)]
                if family != "current" or kind is None or not objects or len(objects) < 2:
                    continue
                held = {first + patch for o in objects for patch in object_patches(objects, o[:2])}
                others = sorted(held - set(asked))
                right = bool(logits[row].argmax() == batch["labels"][0][row + 1])
                key = (kind, "right" if right else "wrong")
                sums = mass.setdefault(key, torch.zeros(len(layers), heads, 2))
                for layer in layers:
                    weights = probe.weights[layer][:, number]
                    sums[layer, :, 0] += weights[:, asked].sum(-1)
                    sums[layer, :, 1] += weights[:, others].sum(-1)
                count[key] += 1
        print(f"# {path}: attention mass of the answering token, asked object / other objects in view "
              "(2-3 objects in view, current-scene lookups, 20 validation episodes of 64 s)")
        for key in sorted(count):
            print(f"{key[0]} answered {key[1]}: {count[key]}")
            for layer in layers:
                average = mass[key][layer] / count[key]
                print(f"  layer {layer}  " + "  ".join(f"h{h} {average[h, 0]:.2f}/{average[h, 1]:.2f}"
                                                     for h in range(heads)))


if __name__ == "__main__":
    main()
