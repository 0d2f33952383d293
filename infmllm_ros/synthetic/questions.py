"""Questions about a synthetic episode, with answers taken from the world state.

Four families probe four memory ranges of a streaming model that is fed frames at
FEED_RATE_HZ: what is in view now ("current"), what just left ("recent"), an object seen
once up to a minute ago ("long"), and one seen once 2-8 minutes ago ("distant": its evidence
lies outside the recent window of any budget the quality suite runs, so only a cache that
keeps the right old tokens can answer it). A question is asked only when its answer is
unambiguous for a model that saw the stream sampled at FEED_RATE_HZ with any phase, so a
label is never a coin flip. Texts are short fixed templates with 1-2 word answers, so a
tiny model can spend its capacity on seeing and remembering, not on language.
"""

from __future__ import annotations

import itertools
import math
import string
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from .render import COLOURS, SHAPES, WIDTH
from .world import Episode, WorldObject, fully_inside, generate_episode

FEED_RATE_HZ = 1.0  # frames per second the model sees; the bag itself is 10 Hz
FAMILIES: tuple[str, ...] = ("current", "recent", "long", "distant")
COUNT_WORDS: tuple[str, ...] = ("zero", "one", "two", "three")
SIDES: tuple[str, ...] = ("left", "right")
TEMPLATES: dict[str, str] = {
    "colour_of_shape": "what colour is the {shape}?",
    "shape_of_colour": "what shape is the {colour} object?",
    "count": "how many objects are in view?",
    "side": "is the {colour} {shape} on the left or the right?",
    "last_left": "what left the view most recently?",
    "colour_of_shape_earlier": "what colour was the {shape} seen earlier?",
    "shape_of_colour_earlier": "what shape was the {colour} object seen earlier?",
    # The same words as the long-range kinds: only how far back the evidence lies differs.
    "colour_of_shape_distant": "what colour was the {shape} seen earlier?",
    "shape_of_colour_distant": "what shape was the {colour} object seen earlier?",
}
FAMILY_OF_KIND: dict[str, str] = {
    "colour_of_shape": "current",
    "shape_of_colour": "current",
    "count": "current",
    "side": "current",
    "last_left": "recent",
    "colour_of_shape_earlier": "long",
    "shape_of_colour_earlier": "long",
    "colour_of_shape_distant": "distant",
    "shape_of_colour_distant": "distant",
}
SIDE_MARGIN_PX = 60.0  # "left"/"right" only for centres at least this far off the middle
RECENT_AFTER_S = (2.0, 8.0)  # ask "what left" this long after it left
RECENT_CLEAR_S = 2.0  # ...and only if the exit before it was this much earlier (two 1 Hz frames)
LONG_GONE_S = 15.0  # a long-range target left at least this long before the question
LONG_WITHIN_S = 60.0  # ...and entered at most this long before: inside a 64-frame context
DISTANT_GONE_S, DISTANT_WITHIN_S = 120.0, 480.0  # distant: left >= 2 min and entered <= 8 min before
DEFAULT_SPACING_S = 3.0
_DT = 0.05  # s, resolution of the precomputed timeline
# Question times sit halfway between 10 Hz frame stamps, so a query never shares a stamp
# with an image and "the latest frame before the question" is never ambiguous.
_TIME_OFFSET_S, _TIME_STEP_S = 0.05, 0.1


@dataclass(frozen=True)
class Question:
    """One question at time t (seconds since episode start) and its ground-truth answer."""

    t: float
    family: str
    text: str
    answer: str
    kind: str
    #: (t_enter, t_exit) of the object the answer is about, for the memory families: where in the
    #: stream the evidence lies, so benchmarks can ask whether a cache still holds it. None for
    #: "current" (the evidence is the newest frame).
    evidence: tuple[float, float] | None = None


class _Timeline:
    """Every object's position sampled every _DT over the episode (one vectorised pass)."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode
        self.ts = np.arange(int(math.ceil(episode.duration_s / _DT)) + 1) * _DT
        shape = (len(episode.objects), len(self.ts))
        self.alive = np.zeros(shape, dtype=bool)
        self.clear = np.zeros(shape, dtype=bool)  # alive and fully in view
        self.x = np.zeros(shape)
        for o in episode.objects:
            x, y = o.positions(self.ts)
            self.alive[o.id] = (self.ts >= o.t_enter) & (self.ts < o.t_exit)
            self.clear[o.id] = self.alive[o.id] & fully_inside(x, y, o.radius)
            self.x[o.id] = x
        self.window = int(round(1.0 / FEED_RATE_HZ / _DT))
        self.by_exit = sorted(episode.objects, key=lambda o: o.t_exit)

    def settled(self, i: int) -> list[WorldObject] | None:
        """Objects in view over the last feed period up to sample i, if none was in transit.

        Whatever the sampling phase, the model's latest frame then shows exactly these,
        whole, so counting and naming them is well defined.
        """
        if i < self.window:
            return None
        w = slice(i - self.window, i + 1)
        ids = np.flatnonzero(self.alive[:, w].any(axis=1))
        if not self.clear[ids, w].all():
            return None
        return [self.episode.objects[j] for j in ids]

    def side(self, obj: WorldObject, i: int) -> str | None:
        xs = self.x[obj.id, i - self.window:i + 1]
        if (xs < WIDTH / 2 - SIDE_MARGIN_PX).all():
            return "left"
        if (xs > WIDTH / 2 + SIDE_MARGIN_PX).all():
            return "right"
        return None

    def candidates(self, t: float) -> Iterator[tuple]:
        """Every unambiguous (kind, text, answer[, evidence span]) at time t."""
        i = int(round(t / _DT))
        scene = self.settled(i)
        if scene is not None:  # also for "recent": a half-gone object would make it phase-dependent
            yield from self._current(scene, i)
            yield from self._recent(t)
        yield from self._long(t)

    def _current(self, scene: list[WorldObject], i: int) -> Iterator[tuple[str, str, str]]:
        yield "count", TEMPLATES["count"], COUNT_WORDS[len(scene)]
        shapes = Counter(o.shape for o in scene)
        colours = Counter(o.colour for o in scene)
        pairs = Counter((o.colour, o.shape) for o in scene)
        for o in scene:
            if shapes[o.shape] == 1:
                yield "colour_of_shape", TEMPLATES["colour_of_shape"].format(shape=o.shape), o.colour
            if colours[o.colour] == 1:
                yield "shape_of_colour", TEMPLATES["shape_of_colour"].format(colour=o.colour), o.shape
            side = self.side(o, i)
            if pairs[(o.colour, o.shape)] == 1 and side is not None:
                yield "side", TEMPLATES["side"].format(colour=o.colour, shape=o.shape), side

    def _recent(self, t: float) -> Iterator[tuple[str, str, str]]:
        gone = [o for o in self.by_exit if o.t_exit <= t]
        if not gone:
            return
        last = gone[-1]
        earlier_ok = len(gone) == 1 or gone[-2].t_exit <= last.t_exit - RECENT_CLEAR_S
        if earlier_ok and RECENT_AFTER_S[0] <= t - last.t_exit <= RECENT_AFTER_S[1]:
            yield "last_left", TEMPLATES["last_left"], f"{last.colour} {last.shape}", (last.t_enter, last.t_exit)

    def _long(self, t: float) -> Iterator[tuple[str, str, str]]:
        yield from self._seen_once(t, LONG_GONE_S, LONG_WITHIN_S, "earlier")
        yield from self._seen_once(t, DISTANT_GONE_S, DISTANT_WITHIN_S, "distant")

    def _seen_once(self, t: float, gone_s: float, within_s: float, suffix: str) -> Iterator[tuple]:
        """Objects whose colour or shape is unique in the whole stream so far, that left at least
        gone_s and entered at most within_s before t."""
        # "Seen" counts anything that has started to enter: stricter than what the
        # model may have glimpsed, so a uniqueness claim can only err on the safe side.
        seen = [o for o in self.episode.objects if o.t_enter < t]
        shapes = Counter(o.shape for o in seen)
        colours = Counter(o.colour for o in seen)
        for o in seen:
            if o.t_exit > t - gone_s or o.t_enter < t - within_s:
                continue
            if shapes[o.shape] == 1:
                kind = f"colour_of_shape_{suffix}"
                yield kind, TEMPLATES[kind].format(shape=o.shape), o.colour, (o.t_enter, o.t_exit)
            if colours[o.colour] == 1:
                kind = f"shape_of_colour_{suffix}"
                yield kind, TEMPLATES[kind].format(colour=o.colour), o.shape, (o.t_enter, o.t_exit)


def _grid(start: float, end: float) -> Iterator[float]:
    k = max(0, math.ceil((start - _TIME_OFFSET_S) / _TIME_STEP_S - 1e-9))
    while (t := round(_TIME_OFFSET_S + k * _TIME_STEP_S, 3)) < end:
        yield t
        k += 1


# Labels balanced within each kind. "last_left" counts as one: its 24 colour-shape answers
# follow each episode's random schedule, so they carry no prior worth flattening.
_LABELS: dict[str, int] = {
    "colour_of_shape": len(COLOURS),
    "shape_of_colour": len(SHAPES),
    "count": len(COUNT_WORDS),
    "side": len(SIDES),
    "last_left": 1,
    "colour_of_shape_earlier": len(COLOURS),
    "shape_of_colour_earlier": len(SHAPES),
    "colour_of_shape_distant": len(COLOURS),
    "shape_of_colour_distant": len(SHAPES),
}
_KINDS_IN_FAMILY = Counter(FAMILY_OF_KIND.values())


def _overdue(key: tuple[str, str], used: Counter[object]) -> int:
    """How many questions would have been asked by now if every family, and every label
    of this kind, were as common as this one's; the lowest is the most overdue.

    One score balances families, kinds and answers together, so an often-empty view
    cannot fill the current family with "zero" while other families wait.
    """
    kind = key[0]
    family = FAMILY_OF_KIND[kind]
    label_share = len(FAMILIES) * _KINDS_IN_FAMILY[family] * _LABELS[kind]
    return used[family] * len(FAMILIES) + used[key] * label_share


def generate_questions(episode: Episode, rng_or_seed: int | np.random.Generator,
                       spacing_s: float = DEFAULT_SPACING_S) -> list[Question]:
    """About one question per spacing_s seconds, sorted by time, at least spacing_s/2 apart.

    Each slot picks, among the valid questions in it, the most overdue (kind, answer)
    (random among ties), then a random time for it. Balanced labels stop the model from
    scoring by priors, e.g. answering "zero" because the view is often empty.
    """
    rng = np.random.default_rng(rng_or_seed)
    timeline = _Timeline(episode)
    used: Counter[object] = Counter()
    questions: list[Question] = []
    slot = 1.0 / FEED_RATE_HZ  # before one feed period nothing has been seen for sure
    while slot < episode.duration_s:
        end = min(slot + spacing_s, episode.duration_s)
        start = max(slot, questions[-1].t + spacing_s / 2) if questions else slot
        options: dict[tuple[str, str], list[tuple]] = defaultdict(list)
        for t in _grid(start, end):
            for kind, text, answer, *evidence in timeline.candidates(t):
                options[(kind, answer)].append((t, text, *evidence))
        if options:
            keys = sorted(options)  # a fixed order, so the same rng draws pick the same one
            scores = [_overdue(k, used) for k in keys]
            ties = [k for k, score in zip(keys, scores) if score == min(scores)]
            key = ties[int(rng.integers(len(ties)))]
            t, text, *evidence = options[key][int(rng.integers(len(options[key])))]
            family = FAMILY_OF_KIND[key[0]]
            used.update([family, key])
            questions.append(Question(t, family, text, key[1], key[0], evidence[0] if evidence else None))
        slot = end
    return questions


def questions_at(episode: Episode, times: Iterable[float]) -> list[list[Question]]:
    """Every unambiguous question at each of `times` (not one per slot, not balanced): what a
    trainer can ask besides the stream's own questions."""
    timeline = _Timeline(episode)
    asked = []
    for t in times:
        asked.append([Question(t, FAMILY_OF_KIND[kind], text, answer, kind, evidence[0] if evidence else None)
                      for kind, text, answer, *evidence in timeline.candidates(t)])
    return asked


def possible_answers() -> list[str]:
    """Every answer string the generator can produce."""
    pairs = [f"{c} {s}" for c in COLOURS for s in SHAPES]
    return [*COLOURS, *SHAPES, *COUNT_WORDS, *SIDES, *pairs]


def possible_questions() -> list[str]:
    """Every question text the generator can produce (each template, every filling)."""
    values = {"colour": list(COLOURS), "shape": list(SHAPES)}
    texts = []
    for template in dict.fromkeys(TEMPLATES.values()):
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
        for combo in itertools.product(*(values[f] for f in fields)):
            texts.append(template.format(**dict(zip(fields, combo))))
    return texts


def corpus_text(seeds: Iterable[int], duration_s: float = 120.0) -> Iterator[str]:
    """Strings to train a tokenizer on.

    First every possible question and answer once, so nothing is ever out of vocabulary,
    then those generated for each seed's episode, so token frequencies are realistic.
    """
    yield from possible_questions()
    yield from possible_answers()
    for seed in seeds:
        for q in generate_questions(generate_episode(seed, duration_s), seed):
            yield q.text
            yield q.answer
