"""Linear probes: can a seen-once object be found among ten minutes of frames from what the model holds?

The embedded model answers "what colour was the <shape> seen earlier?" at chance on 10-minute
streams, yet reads it once the stream is cut down to the object's frames. That is a retrieval
failure, and retrieval needs keys: tokens whose representation says "this is the triangle"
more loudly than any of the thousands of other patches. A linear probe measures how much of that
a representation holds: fitted on the training streams' patches (per patch: the shape and colour
of the object it holds, as the vision stage labels them), it scores every frame of a held-out
10-minute stream by its best patch, and we ask whether the frames that show a seen-once shape or
colour come out on top (precision at k, k = the frames that show it). Representations probed:
the tower's output (what LLaVA hands the projector) and the language model's hidden states at
the image tokens after each layer, on a stream of frames alone.

    python -m infmllm_ros.tiny_model.probe --work-dir build/train-tiny --model-path infmllm_ros/models/tiny_llava
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import AutoModelForImageTextToText, AutoTokenizer

from infmllm_ros.engine.loading import resolve_model_path
from infmllm_ros.synthetic import COLOURS, SHAPES, generate_episode

from .data import SequenceWriter
from .features import input_embeddings
from .streams import RenderedStream
from .vision_pretraining import patch_targets

ATTRIBUTES = {"shape": list(SHAPES), "colour": list(COLOURS)}
_PROBE_STEPS, _PROBE_BATCH, _PROBE_LR = 400, 8192, 1e-2


def hidden_states(model, tokenizer, stream: RenderedStream) -> list[torch.Tensor]:
    """(frames, patches, width) per representation: the tower's output, then the language model's
    hidden state at each frame's image tokens after every layer, on a stream of frames alone."""
    writer = SequenceWriter(tokenizer)
    for _ in range(len(stream.frame_times)):
        writer.frame()
    batch = writer.batch(stream.features)
    with torch.inference_mode():
        output = model(inputs_embeds=input_embeddings(model, batch["input_ids"], batch["features"]),
                       position_ids=batch["position_ids"], output_hidden_states=True)
    image = batch["input_ids"][0] == model.config.image_token_index
    frames, patches = stream.features.shape[:2]
    return [stream.features.float()] + [layer[0, image].reshape(frames, patches, -1).float()
                                        for layer in output.hidden_states[1:]]


def patch_labels(stream: RenderedStream) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(frames with whole objects, their per-patch shape, colour), 0 = nothing."""
    kept, shapes, colours = [], [], []
    for index, objects in enumerate(stream.objects):
        if objects is not None:
            colour, shape, _ = patch_targets(objects)
            kept.append(index)
            shapes.append(shape)
            colours.append(colour)
    return torch.tensor(kept), torch.stack(shapes), torch.stack(colours)


def fit_probe(inputs: torch.Tensor, labels: torch.Tensor, classes: int, seed: int = 0) -> torch.nn.Linear:
    generator = torch.Generator().manual_seed(seed)
    probe = torch.nn.Linear(inputs.shape[1], classes)
    optimizer = torch.optim.Adam(probe.parameters(), _PROBE_LR)
    for _ in range(_PROBE_STEPS):
        pick = torch.randint(len(inputs), (_PROBE_BATCH,), generator=generator)
        loss = F.cross_entropy(probe(inputs[pick]), labels[pick])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return probe


def retrieval_precision(log_probs: torch.Tensor, stream: RenderedStream, episode, attribute: str) -> list[float]:
    """Per seen-once value of `attribute` in the stream's episode: the share of the k frames whose best
    patch scores it highest that show the object (k = frames that show it)."""
    names = ATTRIBUTES[attribute]
    uses = collections.Counter(getattr(obj, attribute) for obj in episode.objects)
    scores = []
    for value, count in uses.items():
        if count != 1:
            continue
        obj = next(o for o in episode.objects if getattr(o, attribute) == value)
        shown = (stream.frame_times >= obj.t_enter) & (stream.frame_times < obj.t_exit)
        frame_score = log_probs[:, :, names.index(value) + 1].max(1).values
        top = frame_score.topk(int(shown.sum())).indices.numpy()
        scores.append(float(shown[top].mean()))
    return scores


def probe_representations(model, tokenizer, train: list[RenderedStream], held_out: list[RenderedStream]) -> list[dict]:
    """One row per representation: held-out patch accuracy and retrieval precision per attribute."""
    fitted = collections.defaultdict(lambda: {"inputs": [], "shape": [], "colour": []})
    for stream in tqdm(train, desc="probe: training streams", unit="stream"):
        kept, shapes, colours = patch_labels(stream)
        for depth, states in enumerate(hidden_states(model, tokenizer, stream)):
            fitted[depth]["inputs"].append(states[kept].flatten(0, 1))
            fitted[depth]["shape"].append(shapes.flatten())
            fitted[depth]["colour"].append(colours.flatten())
    probes = {depth: {attribute: fit_probe(torch.cat(part["inputs"]), torch.cat(part[attribute]),
                                           len(names) + 1)
                      for attribute, names in ATTRIBUTES.items()} for depth, part in fitted.items()}
    results = {depth: {"right": collections.Counter(), "held": collections.Counter(),
                       "precision": collections.defaultdict(list)} for depth in probes}
    for stream in tqdm(held_out, desc="probe: held-out streams", unit="stream"):
        kept, shapes, colours = patch_labels(stream)
        labels = {"shape": shapes, "colour": colours}
        episode = generate_episode(stream.seed, round(len(stream.frame_times)))
        for depth, states in enumerate(hidden_states(model, tokenizer, stream)):
            with torch.no_grad():
                for attribute, probe in probes[depth].items():
                    logits = probe(states)
                    occupied = labels[attribute] > 0
                    hits = logits[kept].argmax(-1) == labels[attribute]
                    results[depth]["right"][attribute] += int(hits[occupied].sum())
                    results[depth]["held"][attribute] += int(occupied.sum())
                    results[depth]["precision"][attribute] += retrieval_precision(
                        logits.log_softmax(-1), stream, episode, attribute)
    rows = []
    for depth, result in results.items():
        row = {"representation": "tower output" if depth == 0 else f"language model layer {depth}"}
        for attribute in ATTRIBUTES:
            precision = result["precision"][attribute]
            row[f"patch_{attribute}"] = result["right"][attribute] / max(result["held"][attribute], 1)
            row[f"find_{attribute}"] = float(np.mean(precision)) if precision else float("nan")
            row[f"seen_once_{attribute}s"] = len(precision)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("build/train-tiny"),
                        help="an infmllm-train-tiny work directory (its streams.pt: frames with the tower's features)")
    parser.add_argument("--model-path", default=None, help="the model whose language model is probed (default: embedded)")
    parser.add_argument("--train-streams", type=int, default=12, help="training streams the probes are fitted on")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cached = args.work_dir / "streams.pt"
    if not cached.is_file():
        print(f"probe: no {cached}; run infmllm-train-tiny with --work-dir {args.work_dir} first", file=sys.stderr)
        return 2
    saved = torch.load(cached, weights_only=False)
    model_dir = resolve_model_path(args.model_path)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = probe_representations(model, tokenizer, saved["train"][:args.train_streams], saved["validation"])
    if args.json:
        print(json.dumps({"model": str(model_dir), "work_dir": str(args.work_dir), "rows": rows}, indent=2))
        return 0
    print(f"linear probes of {model_dir} on {len(saved['validation'])} held-out 10-minute streams "
          f"(fitted on {args.train_streams} training streams)\n")
    print("| representation | patch shape | patch colour | seen-once shape found (precision@k) "
          "| seen-once colour found (precision@k) |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['representation']} | {100 * row['patch_shape']:.1f} % | {100 * row['patch_colour']:.1f} % "
              f"| {row['find_shape']:.2f} ({row['seen_once_shapes']} objects) "
              f"| {row['find_colour']:.2f} ({row['seen_once_colours']} objects) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
