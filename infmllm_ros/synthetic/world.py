"""Scene model of the synthetic robot-camera world: which object is where, and when.

The world is continuous in time, so one episode can be rendered at 10 Hz for a bag and
sampled at 1 Hz by the model, and it is a pure function of one integer seed, so that
episodes, frames and questions are regenerated anywhere instead of being stored.
Ground truth for questions comes from here, never from pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from .render import BOUND, COLOURS, HEIGHT, SHAKE_PX, SHAPES, WIDTH, render_frame

FloatOrArray = float | np.ndarray
BoolOrArray = bool | np.ndarray

MAX_IN_VIEW = 3
RADIUS_RANGE = (55.0, 85.0)  # px at 640x480: still 11-17 px across at 64x64
GAP_PX = 24.0  # clearance between bounding circles, so blobs never touch and counting is exact
IN_VIEW_MARGIN_PX = SHAKE_PX + 2  # "fully in view" must hold whatever the camera shake
_EDGE_PAD = IN_VIEW_MARGIN_PX + 3  # settled objects keep this far from the image border
_OFF_SCREEN_PX = SHAKE_PX + 5  # edge transits start and end this far beyond the border
_SPEED_RANGE = (120.0, 200.0)  # px/s while entering or leaving across an edge
_DWELL_RANGE = (4.0, 9.0)  # s settled in view; with transits an object is in view for about 4-15 s
_DRIFT_X, _DRIFT_Y = (4.0, 20.0), (4.0, 14.0)  # px amplitude of the slow wander while settled
_DRIFT_PERIOD = (8.0, 20.0)  # s
_EDGE_P = 0.6  # chance to enter (or leave) across the nearer side edge instead of (dis)appearing
# A few attributes recur all episode; the rest are "rare" and each is used by a single
# object, so every episode has objects that were seen exactly once and whose colour or
# shape is unique so far: that is what the long-range questions ask about.
_COMMON_COLOURS, _COMMON_SHAPES = 2, 2
_RARE_GAP_S = (16.0, 24.0)  # between rare objects: spread out so long-range questions are too
_COMMON_MEAN_GAP_S = 7.0  # mean gap between recurring objects (about 1.3 in view on average)
_PLACE_TRIES = 40
_LOOKAHEAD_S = 30.0  # > the longest life (~17 s): see generate_episode
_CHECK_DT = 0.04  # s; transits move < 8 px per step each, well inside GAP_PX


def fully_inside(x: FloatOrArray, y: FloatOrArray, radius: float) -> BoolOrArray:
    """Whether a shape at (x, y) is wholly inside the frame whatever the camera shake.

    Works elementwise on arrays too, so the question generator can test whole timelines.
    """
    b = BOUND * radius + IN_VIEW_MARGIN_PX
    return (x >= b) & (x <= WIDTH - b) & (y >= b) & (y <= HEIGHT - b)


@dataclass(frozen=True)
class ObjectState:
    """One object as it is at one instant (all a question or the renderer needs)."""

    id: int
    colour: str
    shape: str
    x: float
    y: float
    radius: float

    @property
    def fully_in_view(self) -> bool:
        return bool(fully_inside(self.x, self.y, self.radius))


@dataclass(frozen=True)
class WorldObject:
    """An object's whole life: it enters, settles and wanders slowly, then leaves.

    Enter and leave are either a horizontal transit across the nearer side edge or an
    instant (dis)appearance (then ``t_settle == t_enter`` / ``t_exit == t_leave``).
    It is in the episode for ``t_enter <= t < t_exit``.
    """

    id: int
    colour: str
    shape: str
    radius: float
    t_enter: float
    t_settle: float
    t_leave: float
    t_exit: float
    start_x: float  # x at t_enter; y stays home_y during the entry transit
    end_x: float  # x at t_exit; y stays where it was at t_leave
    home_x: float
    home_y: float
    drift: tuple[float, float]  # wander amplitude (x, y), px
    omega: tuple[float, float]  # wander angular frequency (x, y), rad/s

    @property
    def bound(self) -> float:
        return BOUND * self.radius

    def positions(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Centre (x, y) at each time in ts (vectorised: the schedule checks thousands)."""
        ts = np.asarray(ts, dtype=float)
        settled = np.clip(ts, self.t_settle, self.t_leave) - self.t_settle
        # The wander starts at zero at t_settle, so the path is continuous.
        x = self.home_x + self.drift[0] * np.sin(self.omega[0] * settled)
        y = self.home_y + self.drift[1] * np.sin(self.omega[1] * settled)
        if self.t_settle > self.t_enter:
            a = (ts - self.t_enter) / (self.t_settle - self.t_enter)
            x = np.where(ts < self.t_settle, self.start_x + (self.home_x - self.start_x) * a, x)
        if self.t_exit > self.t_leave:
            leave_x = self.home_x + self.drift[0] * math.sin(self.omega[0] * (self.t_leave - self.t_settle))
            a = (ts - self.t_leave) / (self.t_exit - self.t_leave)
            x = np.where(ts > self.t_leave, leave_x + (self.end_x - leave_x) * a, x)
        return x, y

    def in_episode(self, t: float) -> bool:
        return self.t_enter <= t < self.t_exit

    def state(self, t: float) -> ObjectState:
        x, y = self.positions(np.array([t]))
        return ObjectState(self.id, self.colour, self.shape, float(x[0]), float(y[0]), self.radius)


@dataclass(frozen=True)
class Episode:
    """A deterministic stream of scenes: ``generate_episode(seed, d)`` always gives the same one."""

    seed: int
    duration_s: float
    objects: tuple[WorldObject, ...]  # sorted by t_enter; ids are indices

    def visible(self, t: float) -> list[ObjectState]:
        """Objects in the episode at time t (possibly partly off-screen while in transit)."""
        return [o.state(t) for o in self.objects if o.in_episode(t)]

    def render(self, t: float) -> np.ndarray:
        """The camera frame at time t: (480, 640, 3) uint8 RGB."""
        return render_frame(self.seed, t, self.visible(t))

    def frames(self, rate_hz: float, start: float = 0.0,
               end: float | None = None) -> Iterator[tuple[float, np.ndarray]]:
        """Yield (t, rgb) at rate_hz over [start, end); end defaults to the episode's end."""
        end = self.duration_s if end is None else end
        k = 0
        while (t := start + k / rate_hz) < end:  # index-based, so times do not drift
            yield t, self.render(t)
            k += 1


def _nearer_edge_x(x: float, bound: float) -> float:
    return -bound - _OFF_SCREEN_PX if x < WIDTH / 2 else WIDTH + bound + _OFF_SCREEN_PX


def _sample_object(rng: np.random.Generator, colour: str, shape: str, t0: float) -> WorldObject:
    """Draw one candidate life for an object that starts entering at t0."""
    radius = float(rng.uniform(*RADIUS_RANGE))
    bound = BOUND * radius
    drift = (float(rng.uniform(*_DRIFT_X)), float(rng.uniform(*_DRIFT_Y)))
    omega = (float(2 * math.pi / rng.uniform(*_DRIFT_PERIOD)),
             float(2 * math.pi / rng.uniform(*_DRIFT_PERIOD)))
    home_x = float(rng.uniform(bound + drift[0] + _EDGE_PAD, WIDTH - bound - drift[0] - _EDGE_PAD))
    home_y = float(rng.uniform(bound + drift[1] + _EDGE_PAD, HEIGHT - bound - drift[1] - _EDGE_PAD))
    speed = float(rng.uniform(*_SPEED_RANGE))
    dwell = float(rng.uniform(*_DWELL_RANGE))
    start_x = _nearer_edge_x(home_x, bound) if rng.random() < _EDGE_P else home_x
    t_settle = t0 + abs(home_x - start_x) / speed
    t_leave = t_settle + dwell
    leave_x = home_x + drift[0] * math.sin(omega[0] * dwell)
    end_x = _nearer_edge_x(leave_x, bound) if rng.random() < _EDGE_P else leave_x
    t_exit = t_leave + abs(end_x - leave_x) / speed
    return WorldObject(-1, colour, shape, radius, t0, t_settle, t_leave, t_exit,
                       start_x, end_x, home_x, home_y, drift, omega)


def _fits(obj: WorldObject, placed: list[WorldObject]) -> bool:
    """At most MAX_IN_VIEW at once, and never closer than GAP_PX to anything else."""
    ts = np.arange(obj.t_enter, obj.t_exit, _CHECK_DT)
    x, y = obj.positions(ts)
    count = np.ones(len(ts), dtype=int)
    for other in placed:
        if other.t_exit <= obj.t_enter or other.t_enter >= obj.t_exit:
            continue
        alive = (ts >= other.t_enter) & (ts < other.t_exit)
        ox, oy = other.positions(ts[alive])
        if (np.hypot(x[alive] - ox, y[alive] - oy) < obj.bound + other.bound + GAP_PX).any():
            return False
        count += alive
    return bool(count.max() <= MAX_IN_VIEW)


def _place(rng: np.random.Generator, placed: list[WorldObject], colour: str, shape: str,
           t0: float) -> WorldObject | None:
    for _ in range(_PLACE_TRIES):
        obj = _sample_object(rng, colour, shape, t0)
        if _fits(obj, placed):
            return obj
    return None


def _rare_pairs(rng: np.random.Generator, colours: list[str], shapes: list[str]) -> list[tuple[str, str]]:
    """(colour, shape) of the seen-once objects: each rare attribute is used exactly once.

    A rare shape gets a rare colour half the time (then both long-range questions can be
    asked about it), otherwise a common colour; leftover rare colours get common shapes.
    """
    common_c, rare_c = colours[:_COMMON_COLOURS], colours[_COMMON_COLOURS:]
    common_s, rare_s = shapes[:_COMMON_SHAPES], shapes[_COMMON_SHAPES:]
    pairs = []
    for shape in rare_s:
        take_rare = rng.random() < 0.5
        pairs.append((rare_c.pop() if take_rare else common_c[rng.integers(len(common_c))], shape))
    pairs += [(c, common_s[rng.integers(len(common_s))]) for c in rare_c]
    return [pairs[i] for i in rng.permutation(len(pairs))]


def generate_episode(seed: int, duration_s: float) -> Episode:
    """The episode for a non-negative seed: same (seed, duration_s), same episode.

    The schedule runs _LOOKAHEAD_S past the end and is then cut, and rare and recurring
    objects draw from separate streams, so a longer episode of a seed begins with exactly
    the objects of a shorter one: a short test bag is a prefix of the demo bag.
    """
    rare_rng, common_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    horizon = duration_s + _LOOKAHEAD_S
    colours = [str(c) for c in rare_rng.permutation(list(COLOURS))]
    shapes = [str(s) for s in rare_rng.permutation(list(SHAPES))]
    placed: list[WorldObject] = []
    # Rare objects first, so the recurring ones are fitted around them and never crowd
    # them out; a rare one that does not fit is tried a little later instead.
    t = float(rare_rng.uniform(1.0, 4.0))
    for colour, shape in _rare_pairs(rare_rng, colours, shapes):
        obj = None
        while obj is None and t < horizon:
            obj = _place(rare_rng, placed, colour, shape, t)
            if obj is None:
                t += 1.0
        if obj is None:
            break
        placed.append(obj)
        t += float(rare_rng.uniform(*_RARE_GAP_S))
    common = [(c, s) for c in colours[:_COMMON_COLOURS] for s in shapes[:_COMMON_SHAPES]]
    t = float(common_rng.exponential(_COMMON_MEAN_GAP_S / 2))
    while t < horizon:
        colour, shape = common[common_rng.integers(len(common))]
        obj = _place(common_rng, placed, colour, shape, t)
        if obj is not None:
            placed.append(obj)
        t += float(common_rng.exponential(_COMMON_MEAN_GAP_S))
    kept = sorted((o for o in placed if o.t_enter < duration_s), key=lambda o: o.t_enter)
    return Episode(seed, float(duration_s), tuple(replace(o, id=i) for i, o in enumerate(kept)))
