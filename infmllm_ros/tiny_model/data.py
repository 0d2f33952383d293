"""Training sequences cut from rendered streams: frames at 1 Hz interleaved with questions.

A sequence is written exactly as the session will write a live stream (architecture.PROMPT):
each frame is "<frame>" plus its visual tokens, each question "<q> ... <a>" followed by the
answer and "</s>". Only answer tokens carry loss.

Three things here exist to make the model *remember* rather than guess:
- a memory question is kept only if the window shows its evidence, and only its first asking
  (question and answer) in a window: a repeated question could otherwise be answered by copying
  the answer given a minute before, which teaches nothing about frames;
- windows may have a gap: a few frames around an object, then frames minutes later, with the
  position ids advanced as if the skipped minutes had been streamed. That is how a 1,500-token
  sequence teaches retrieval over the 2,000-10,000 positions a 10-minute stream spans;
- every window starts at a random position offset, so the model meets, in training, the absolute
  and relative positions a long stream reaches (a Llama trained only on 0-2,047 degraded past it);
- side questions: many more questions than the stream itself asks, each in its own branch
  that sees the stream up to its time but that nothing later sees (an attention mask, with
  the positions it would have had). So one forward pass over a window answers dozens of
  memory questions where the stream holds a few, and no answer can be copied from another.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

from infmllm_ros.synthetic import FEED_RATE_HZ, generate_episode
from infmllm_ros.synthetic.questions import questions_at

from .architecture import IMAGE_TOKENS, MAX_POSITIONS, PROMPT
from .evidence import asked_object, object_patches
from .frame_targets import FIRST_TARGET_TOKEN, frame_words
from .streams import RenderedStream

IGNORE = -100
FRAME_TOKENS = IMAGE_TOKENS + 1
#: positions a second of live stream takes: one frame plus, on average, a third of a question
#: and answer (one every 3 s in evaluation and in the demo bag)
TOKENS_PER_SECOND = FRAME_TOKENS + 4
_REPEAT_CURRENT_S = 4.0  # a current-scene question is not asked again this soon


class SequenceWriter:
    """Token ids, position ids and loss labels of one training stream, in architecture.PROMPT's format."""

    def __init__(self, tokenizer, start_position: int = 0, object_evidence: bool = False) -> None:
        self.tokenizer = tokenizer
        #: evidence at the asked object's own patches (evidence.py), not at whole frames
        self.object_evidence = object_evidence
        self.frame_ids = [tokenizer.convert_tokens_to_ids("<frame>")] + [
            tokenizer.convert_tokens_to_ids("<image>")] * IMAGE_TOKENS
        self.ids: list[int] = []
        self.labels: list[int] = []
        #: per position, the token its output should predict (frame_targets.py), or IGNORE
        self.targets: list[int] = []
        self.positions: list[int] = []
        self.families: list[str] = []   # one per answer of the stream (not per token)
        self.side_families: list[str] = []
        #: per token, -1 for the stream, else the side question (branch) it belongs to
        self.branches: list[int] = []
        self.next_position = start_position
        self._prompts: dict[str, list[int]] = {}
        #: (time, index of its first image token, its objects or None) of every frame written, for
        #: evidence lookups
        self.frame_slots: list[tuple[float, int, list | None]] = []
        #: per question with evidence: the token whose output is its answer's first token, and the
        #: image tokens that show what it asks about (retrieval.py supervises that attention)
        self.retrieval_rows: list[int] = []
        self.retrieval_evidence: list[list[int]] = []
        self.retrieval_families: list[str] = []

    def _append(self, ids: list[int], labels: list[int], targets: list[int] | None = None,
                branch: int = -1) -> None:
        self.ids += ids
        self.labels += labels
        self.targets += targets or [IGNORE] * len(ids)
        self.positions += range(self.next_position, self.next_position + len(ids))
        self.branches += [branch] * len(ids)
        if branch < 0:   # a side question takes no positions from the stream
            self.next_position += len(ids)

    def frame(self, words: list[str | None] | None = None, t: float | None = None,
              objects: list | None = None) -> None:
        """`objects`: the frame's (colour, shape, x, y, radius) per object, for object evidence."""
        if t is not None:
            self.frame_slots.append((t, len(self.ids) + 1, objects))
        targets = [IGNORE] * len(self.frame_ids)
        for offset, word in enumerate(words or []):
            if word is not None:
                targets[FIRST_TARGET_TOKEN + offset] = self.tokenizer.convert_tokens_to_ids(word)
        self._append(self.frame_ids, [IGNORE] * len(self.frame_ids), targets)

    def skip(self, positions: int) -> None:
        """Advance positions as if `positions` tokens had been streamed here."""
        self.next_position += positions

    def question(self, text: str, answer: str, family: str, side: bool = False,
                 evidence: tuple[float, float] | None = None) -> None:
        """The question carries no loss; its answer and the closing "</s>" do. A side question
        is a branch of its own (see batch()). `evidence` (t_enter, t_exit) of a memory question
        marks the frames written in that span as where its answer lies; with object evidence only
        the asked object's patches in them, or, for a current-scene question (no span), its
        patches in the newest frame."""
        if text not in self._prompts:
            self._prompts[text] = self.tokenizer(PROMPT["question"].format(question=text),
                                                 add_special_tokens=False)["input_ids"]
        prompt = self._prompts[text]
        target = self.tokenizer(f"{answer}</s>", add_special_tokens=False)["input_ids"]
        branch = len(self.side_families) if side else -1
        tokens = self._evidence_tokens(evidence, asked_object(text, answer) if self.object_evidence else None)
        if tokens:
            self.retrieval_rows.append(len(self.ids) + len(prompt) - 1)
            self.retrieval_evidence.append(tokens)
            self.retrieval_families.append(family)
        self._append(prompt + target, [IGNORE] * len(prompt) + target, branch=branch)
        (self.side_families if side else self.families).append(family)

    def _evidence_tokens(self, span: tuple[float, float] | None, about: tuple[int, int] | None) -> list[int]:
        """Image tokens where a question's answer lies (see question()); a memory question whose
        object the frames show only in part falls back to the whole frames."""
        if span is None:
            return [first + patch for _, first, objects in self.frame_slots[-1:] if about
                    for patch in object_patches(objects, about)]
        slots = [(first, objects) for t, first, objects in self.frame_slots if span[0] <= t < span[1]]
        patches = [first + patch for first, objects in slots if about for patch in object_patches(objects, about)]
        return patches or [first + offset for first, _ in slots for offset in range(IMAGE_TOKENS)]

    def batch(self, features: torch.Tensor) -> dict:
        batch = {"input_ids": torch.tensor([self.ids]), "labels": torch.tensor([self.labels]),
                 "position_ids": torch.tensor([self.positions]), "features": features,
                 "frame_targets": torch.tensor([self.targets]), "families": self.families,
                 "side_families": self.side_families, "branches": torch.tensor([self.branches]),
                 "retrieval_rows": self.retrieval_rows, "retrieval_evidence": self.retrieval_evidence,
                 "retrieval_families": self.retrieval_families}
        if self.side_families:
            batch["attention_mask"] = branch_mask(torch.tensor(self.branches))
        return batch


def branch_mask(branches: torch.Tensor) -> torch.Tensor:
    """(1, 1, n, n) additive mask: causal, and a side question's tokens are seen only by the
    tokens of the same side question (branches: -1 = the stream)."""
    n = len(branches)
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    visible &= (branches.unsqueeze(0) < 0) | (branches.unsqueeze(0) == branches.unsqueeze(1))
    return torch.zeros(1, 1, n, n).masked_fill(~visible, float("-inf"))


@dataclass
class Window:
    """Which frames of a stream a sequence shows: contiguous runs [start, end) in time order."""

    segments: list[tuple[int, int]]
    start_position: int = 0
    gap_scale: list[float] = field(default_factory=list)  # per gap: positions skipped / seconds skipped

    @property
    def frames(self) -> list[int]:
        return [index for start, end in self.segments for index in range(start, end)]


def build_sequence(stream: RenderedStream, window: Window, tokenizer, frame_targets: bool = False,
                   side_questions: int = 0, rng: random.Random | None = None, balance_kinds: bool = False,
                   side_kinds: frozenset[str] = frozenset(), object_evidence: bool = False) -> dict:
    """input_ids, labels, position_ids, features, families and (if asked) dense per-frame
    targets of one window of a stream, with up to `side_questions` side questions (memory ones
    kind by kind in turn with `balance_kinds`; only of `side_kinds`, when given). Retrieval
    evidence: the frames that show a memory question's object, or with `object_evidence` that
    object's patches, for current-scene questions too (evidence.py)."""
    times = stream.frame_times
    shown = times[window.frames]
    writer = SequenceWriter(tokenizer, window.start_position, object_evidence)
    asked: set[tuple[str, str]] = set()
    last_current: dict[str, float] = {}
    pending = iter(stream.questions)
    question = next(pending, None)
    side = (_pick_side_questions(stream, window, shown, side_questions, rng, balance_kinds, side_kinds)
            if side_questions else {})
    written = 0   # frames already in the sequence
    for number, (start, end) in enumerate(window.segments):
        if number:
            skipped_s = times[start] - times[window.segments[number - 1][1] - 1] - 1.0 / FEED_RATE_HZ
            writer.skip(int(skipped_s * TOKENS_PER_SECOND * window.gap_scale[number - 1]))
        segment_end = times[end - 1] + 1.0 / FEED_RATE_HZ
        for index in range(start, end):
            writer.frame(frame_words(stream, index, shown[:written]) if frame_targets else None, t=float(times[index]),
                         objects=stream.objects[index])
            written += 1
            for extra in side.get(index, []):
                writer.question(extra.text, extra.answer, extra.family, side=True, evidence=extra.evidence)
            until = times[index + 1] if index + 1 < end else segment_end
            while question is not None and question.t < until:
                if question.t > times[index] and _answerable(question, shown, asked, last_current):
                    writer.question(question.text, question.answer, question.family, evidence=question.evidence)
                question = next(pending, None)
        while question is not None and question.t < segment_end:   # questions of the skipped time
            question = next(pending, None)
    return writer.batch(stream.features[window.frames])


#: side questions per family, as shares of those asked of a window: memory first, since the
#: stream's own questions already ask the current scene most often
SIDE_SHARES = {"recent": 0.3, "long": 0.3, "distant": 0.2, "current": 0.2}
_CANDIDATES: dict[tuple[int, int], list] = {}


def side_candidates(stream: RenderedStream) -> list:
    """Per frame, every question answerable just after it (cached per stream)."""
    key = (stream.seed, len(stream.frame_times))
    if key not in _CANDIDATES:
        episode = generate_episode(stream.seed, round(len(stream.frame_times) / FEED_RATE_HZ))
        _CANDIDATES[key] = questions_at(episode, [round(float(t) + 0.5 / FEED_RATE_HZ, 2) for t in stream.frame_times])
    return _CANDIDATES[key]


def _pick_side_questions(stream, window: Window, shown, count: int, rng: random.Random,
                         balance_kinds: bool = False, kinds: frozenset[str] = frozenset()) -> dict[int, list]:
    """About `count` side questions, by SIDE_SHARES, at random frames of the window whose
    evidence it showed; keyed by the frame they follow. With `kinds`, all `count` are of those
    kinds (a drill: see train.py's --side-kinds)."""
    candidates = side_candidates(stream)
    fair = [(index, question) for index in window.frames for question in candidates[index]
            if _evidence_shown(question, shown)]
    if kinds:
        drill = [option for option in fair if option[1].kind in kinds]
        return _by_frame(rng.sample(drill, min(len(drill), count)))
    by_family: dict[str, list] = {family: [] for family in SIDE_SHARES}
    for option in fair:
        by_family[option[1].family].append(option)
    picked = []
    for family, share in SIDE_SHARES.items():
        options = by_family[family]
        wanted = min(len(options), round(share * count))
        balanced = balance_kinds and family != "current"
        picked += kind_balanced_sample(options, wanted, rng) if balanced else rng.sample(options, wanted)
    return _by_frame(picked)


def _evidence_shown(question, shown) -> bool:
    """A memory question is fair only if the window showed a frame of its evidence."""
    if question.evidence is None:
        return True
    t_enter, t_exit = question.evidence
    return bool(((shown >= t_enter) & (shown < t_exit)).any())


def _by_frame(picked: list) -> dict[int, list]:
    chosen: dict[int, list] = {}
    for index, question in picked:
        chosen.setdefault(index, []).append(question)
    return chosen


def kind_balanced_sample(options: list, count: int, rng: random.Random) -> list:
    """`count` of `options` ((frame, question) pairs), the question kinds taking turns, so a kind
    with fewer candidates is asked as often as the others while it has any: an episode has 2 rare
    shapes against 4 rare colours, and "what colour was the <shape> seen earlier?" was answered
    at chance (README, item 5 of what moved ten-minute memory)."""
    by_kind: dict[str, list] = {}
    for option in options:
        by_kind.setdefault(option[1].kind, []).append(option)
    for group in by_kind.values():
        rng.shuffle(group)
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    picked: list = []
    while len(picked) < count:
        for kind in kinds:
            if by_kind[kind] and len(picked) < count:
                picked.append(by_kind[kind].pop())
    return picked


def _answerable(question, shown, asked: set, last_current: dict) -> bool:
    if question.family == "current":
        if question.t - last_current.get(question.text, -1e9) < _REPEAT_CURRENT_S:
            return False
        last_current[question.text] = question.t
        return True
    key = (question.text, question.answer)
    t_enter, t_exit = question.evidence
    if key in asked or not ((shown >= t_enter) & (shown < t_exit)).any():
        return False
    asked.add(key)
    return True


def sample_window(stream: RenderedStream, rng: random.Random, frames: int, gapped: bool = False,
                  offset_share: float = 0.5, scattered: bool = False) -> Window:
    """A window of about `frames` frames: contiguous; or (gapped) a short run around a
    seen-once object followed, minutes later, by a run that ends where it can be asked about;
    or (scattered) runs around every object askable then, among runs of the minutes between."""
    count = len(stream.frame_times)
    frames = min(frames, count)
    segments = None
    if scattered:
        segments = _scattered_segments(stream, rng, frames)
    elif gapped:
        segments = _gapped_segments(stream, rng, frames)
    if segments is None:
        start = rng.randrange(count - frames + 1)
        segments = [(start, start + frames)]
    gap_scale = [rng.uniform(0.8, 1.25) for _ in segments[1:]]
    span = sum(end - start for start, end in segments) * (FRAME_TOKENS + 12)
    span += sum(int((stream.frame_times[b[0]] - stream.frame_times[a[1] - 1]) * TOKENS_PER_SECOND * g)
                for a, b, g in zip(segments, segments[1:], gap_scale))
    room = max(MAX_POSITIONS - span, 0)
    start_position = rng.randrange(room + 1) if rng.random() < offset_share else 0
    return Window(segments, start_position, gap_scale)


def _gapped_segments(stream: RenderedStream, rng: random.Random, frames: int):
    distant = [q for q in stream.questions if q.family == "distant"]
    if not distant:
        return None
    target = rng.choice(distant)
    times = stream.frame_times
    t_enter, t_exit = target.evidence
    first = [i for i, t in enumerate(times) if t_enter - 4 <= t < t_exit + 4]
    if not first:
        return None
    head = min(len(first), max(4, frames // 4))
    a0 = first[0] + rng.randrange(max(len(first) - head, 0) + 1)
    a1 = min(a0 + head, len(times))
    tail = frames - (a1 - a0)
    b1 = int(next((i for i, t in enumerate(times) if t > target.t), len(times)))
    b0 = max(a1 + 1, b1 - tail)
    if b1 - b0 < 2:
        return None
    return [(a0, a1), (b0, b1)]


def _scattered_segments(stream: RenderedStream, rng: random.Random, frames: int):
    """A gapped window as a 10-minute stream presents it: a run inside every seen-once object a
    question can reach back to at one time (each a wrong answer to the others), short runs
    spread over the minutes between (the recurring objects a model that fails to look back
    copies its answer from: the 600 s evaluation's distant mistakes were those), and a tail
    that ends where the questions are asked. Side questions then ask about all of them."""
    distant = [q for q in stream.questions if q.family == "distant"]
    if not distant:
        return None
    times = stream.frame_times
    ask = int(np.searchsorted(times, rng.choice(distant).t, side="right")) - 1
    if ask < 1:
        return None
    evidence = {q.evidence for q in side_candidates(stream)[ask] if q.family in ("distant", "long")}
    taken = np.zeros(ask + 1, dtype=bool)
    tail = min(rng.randint(6, 16), ask + 1)
    taken[ask + 1 - tail:] = True
    for t_enter, t_exit in evidence:
        inside = np.flatnonzero((times[:ask + 1] >= t_enter) & (times[:ask + 1] < t_exit))
        if len(inside):
            run = min(len(inside), rng.randint(3, 6))
            first = inside[rng.randrange(len(inside) - run + 1)]
            taken[first:first + run] = True
    start = int(np.flatnonzero(taken)[0])
    while taken.sum() < frames and start < ask + 1 - tail:   # distractor runs of 2-4 frames
        first = rng.randrange(start, ask + 1 - tail)
        taken[first:first + rng.randint(2, 4)] = True
        if taken[start:].all():
            break
    edges = np.flatnonzero(np.diff(np.concatenate([[0], taken.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]
