"""Does the answering token know what it is asked, layer by layer? A linear probe on the hidden state
of the token that predicts a current-scene answer ("<a>"), before each layer, names the object word
of the question: the shape in "what colour is the <shape>?", the colour in "what shape is the <colour>
object?". Attention in layer L can only key on what the state before layer L holds: if the shape is
there as well as the colour, a shape-keyed lookup lacks the match between query and keys, not the
question.

Episodes: 80 of 64 s from seed 950,000 (no training or evaluation run uses them), whole, with their own
questions; the probe is fitted on the first 60, scored on the last 20; positions and RoPE as in
training (attention factor 1).

usage (from the repository root): python bench/figures/binding/question_probe.py MODEL_DIR [MODEL_DIR ...]"""
import copy
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForImageTextToText, AutoTokenizer

from infmllm_ros.synthetic import COLOURS, SHAPES
from infmllm_ros.tiny_model.architecture import set_attention_factor
from infmllm_ros.tiny_model.data import Window, build_sequence
from infmllm_ros.tiny_model.features import compute_features, input_embeddings
from infmllm_ros.tiny_model.streams import render_streams

SEEDS, FITTED = range(950_000, 950_080), 60
KINDS = {"what colour is the": ("colour_of_shape", list(SHAPES)),
         "what shape is the": ("shape_of_colour", list(COLOURS))}


def trained_positions(path: str):
    model = AutoModelForImageTextToText.from_pretrained(path)
    set_attention_factor(model.config.text_config, 1.0)
    return AutoModelForImageTextToText.from_pretrained(path, config=model.config).eval()


def answering_states(model, tokenizer, stream):
    """(kind, index of the question's object word, hidden states before every layer) per current-scene lookup."""
    batch = build_sequence(stream, Window([(0, len(stream.frame_times))]), tokenizer)
    ids = batch["input_ids"][0].tolist()
    answer, ask = tokenizer.convert_tokens_to_ids("<a>"), tokenizer.convert_tokens_to_ids("<q>")
    with torch.inference_mode():
        hidden = model(inputs_embeds=input_embeddings(model, batch["input_ids"], batch["features"]),
                       position_ids=batch["position_ids"], output_hidden_states=True).hidden_states
    rows = []
    for row in (i for i, token in enumerate(ids) if token == answer):
        words = tokenizer.decode(ids[max(i for i in range(row) if ids[i] == ask) + 1:row]).replace("?", " ").split()
        for prefix, (kind, vocabulary) in KINDS.items():
            if " ".join(words).startswith(prefix):
                label = next(vocabulary.index(word) for word in words if word in vocabulary)
                rows.append((kind, label, torch.stack([layer[0, row] for layer in hidden[:-1]])))
    return rows


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    streams = render_streams(list(SEEDS), 64.0, tokenizer)
    for path in sys.argv[1:]:
        torch.manual_seed(0)
        model = trained_positions(path)
        examples = []
        for number, rendered in enumerate(streams):
            stream = copy.copy(rendered)   # compute_features drops the pixels: keep them for the next model
            compute_features(model, stream)
            examples += [(number < FITTED, *row) for row in answering_states(model, tokenizer, stream)]
        print(f"# {path}: linear probe on the answering token's state before each layer, naming the question's "
              f"object word; fitted on {FITTED} episodes, held-out accuracy on {len(SEEDS) - FITTED}")
        for kind, vocabulary in KINDS.values():
            fit = [(label, states) for fitted, k, label, states in examples if k == kind and fitted]
            held = [(label, states) for fitted, k, label, states in examples if k == kind and not fitted]
            labels, states = torch.tensor([x[0] for x in fit]), torch.stack([x[1] for x in fit])
            held_labels, held_states = torch.tensor([x[0] for x in held]), torch.stack([x[1] for x in held])
            scores = []
            for layer in range(states.shape[1]):
                probe = torch.nn.Linear(states.shape[-1], len(vocabulary))
                optimizer = torch.optim.AdamW(probe.parameters(), 1e-2, weight_decay=1e-3)
                mean, std = states[:, layer].mean(0), states[:, layer].std(0) + 1e-5
                for _ in range(300):
                    loss = F.cross_entropy(probe((states[:, layer] - mean) / std), labels)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                with torch.no_grad():
                    right = probe((held_states[:, layer] - mean) / std).argmax(-1) == held_labels
                scores.append(f"before layer {layer} {int(right.sum())}/{len(right)}")
            print(f"{kind} (fitted on {len(fit)}): " + ", ".join(scores))


if __name__ == "__main__":
    main()
