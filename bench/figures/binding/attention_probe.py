"""Can "what colour is the <shape>?" be read from the frozen vision tower's 16 patch tokens of one
frame, when two or three objects are in view? Two probes trained on the tower's output for
frames of many short episodes, scored on held-out ones, split by objects in view:

- attention: one head whose query is learnt per asked shape, over the 16 patch tokens, then a
  linear read-out of the colour (what a language-model head keyed by the question can do);
- MLP: the 16 tokens flattened with the asked shape, one hidden layer (no attention).

If attention reads it, the tower binds colour to shape patch by patch and the language model's
attention has to pick the patch (tiny_model/evidence.py).

usage (from the repository root): python bench/figures/binding/attention_probe.py [MODEL_DIR]"""
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForImageTextToText, AutoTokenizer

from infmllm_ros.tiny_model.features import compute_features
from infmllm_ros.tiny_model.streams import render_many_snapshots

TRAIN_SEEDS, HELD_OUT_SEEDS = range(900_000, 900_600), range(950_000, 950_150)   # no training run uses these
STEPS, BATCH, LR = 3000, 256, 3e-3


def examples(model, streams):
    """(patch tokens, asked shape, its colour, objects in view) per uniquely shaped object of every
    frame that shows all of its objects whole."""
    tokens, shapes, colours, in_view = [], [], [], []
    for stream in streams:
        compute_features(model, stream)
        for index, objects in enumerate(stream.objects):
            for colour, shape, *_ in objects or []:
                if [o[1] for o in objects].count(shape) == 1:
                    tokens.append(stream.features[index].float())
                    shapes.append(shape)
                    colours.append(colour)
                    in_view.append(len(objects))
    return torch.stack(tokens), torch.tensor(shapes), torch.tensor(colours), torch.tensor(in_view)


class AttentionProbe(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.query, self.key = torch.nn.Embedding(4, 64), torch.nn.Linear(width, 64)
        self.value, self.out = torch.nn.Linear(width, 64), torch.nn.Linear(64, 6)

    def forward(self, tokens, shape):
        weights = (self.key(tokens) @ self.query(shape).unsqueeze(-1)).squeeze(-1).div(8).softmax(-1)
        return self.out((weights.unsqueeze(-1) * self.value(tokens)).sum(1))


class MLPProbe(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16 * width + 4, 512), torch.nn.GELU(), torch.nn.Linear(512, 6))

    def forward(self, tokens, shape):
        return self.net(torch.cat([tokens.flatten(1), F.one_hot(shape, 4).float()], -1))


def main() -> None:
    torch.manual_seed(0)
    path = sys.argv[1] if len(sys.argv) > 1 else "infmllm_ros/models/tiny_llava"
    model, tokenizer = AutoModelForImageTextToText.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    # both rendered before any features: a worker forked after torch has run its thread pool can hang
    raw_train = render_many_snapshots(list(TRAIN_SEEDS), 8, tokenizer)
    raw_held_out = render_many_snapshots(list(HELD_OUT_SEEDS), 8, tokenizer)
    train, held_out = examples(model, raw_train), examples(model, raw_held_out)
    print(f"# {path}: tower output of {len(raw_train) * 8} training frames ({len(train[0])} questions), "
          f"{len(raw_held_out) * 8} held-out frames ({len(held_out[0])} questions, "
          f"{int((held_out[3] > 1).sum())} with 2-3 objects in view); {STEPS} steps of {BATCH}")
    for probe in (AttentionProbe(train[0].shape[-1]), MLPProbe(train[0].shape[-1])):
        optimizer = torch.optim.AdamW(probe.parameters(), LR, weight_decay=0.01)
        for _ in range(STEPS):
            pick = torch.randint(len(train[0]), (BATCH,))
            loss = F.cross_entropy(probe(train[0][pick], train[1][pick]), train[2][pick])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            right = probe(held_out[0], held_out[1]).argmax(-1) == held_out[2]
        one, several = held_out[3] == 1, held_out[3] > 1
        print(f"{type(probe).__name__:15s} held out: 1 object in view {int(right[one].sum())}/{int(one.sum())}"
              f"  2-3 in view {int(right[several].sum())}/{int(several.sum())}")


if __name__ == "__main__":
    main()
