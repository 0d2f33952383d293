"""Camera model: how the synthetic world looks in a 640x480 RGB frame.

This module owns appearance (palette, shape geometry, floor, sensor effects) so that the
scene model in ``world.py`` only deals with where things are. Every random effect is
drawn from generators seeded by ``(seed, t)``, never from global state, so any frame of
any episode can be regenerated bit-exactly on another machine or in another process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, Sequence

import cv2
import numpy as np

WIDTH, HEIGHT = 640, 480

# Hues spread around the colour wheel and bright enough to stay apart under the
# lighting change: the model sees each object as a blob of only ~10x10 pixels at 64x64,
# so colour has to survive resizing, JPEG and noise.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "orange": (245, 135, 30),
    "yellow": (235, 205, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "purple": (140, 60, 190),
}
# Four silhouettes that differ in outline (round / corners / three points / concave) and
# hence stay distinct at ~12 px; no rotation, so a square never looks like a diamond.
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")

# Every shape fits inside a circle of BOUND * radius (the triangle's circumradius is the
# largest); the world uses it to keep objects apart and to tell when one is fully in view.
BOUND = 1.15
_SQUARE_HALF = 0.8
_CROSS_HALF_LENGTH = 1.1
_CROSS_HALF_WIDTH = 0.36

SHAKE_PX = 3  # camera shake never moves the image by more than this
NOISE_SIGMA = 4.0  # per-pixel Gaussian sensor noise, in 8-bit levels
_MARGIN = SHAKE_PX + 1  # the floor is rendered this much larger so a shaken crop stays inside
_SUBPIXEL_BITS = 4  # cv2 fixed-point shift, so slow drift moves shapes smoothly, not in 1 px hops
_NOISE_STREAM, _LOOK_STREAM = 1, 2  # keep per-frame noise independent of the per-seed look


class Drawable(Protocol):
    """What the renderer needs to know about an object in view (``world.ObjectState``)."""

    colour: str
    shape: str
    x: float
    y: float
    radius: float


@dataclass(frozen=True)
class _Look:
    """Per-seed appearance: floor, lens vignette, lighting and shake parameters."""

    floor: np.ndarray  # (HEIGHT + 2*_MARGIN, WIDTH + 2*_MARGIN, 3) uint8
    vignette: np.ndarray  # (HEIGHT, WIDTH, 1) float32 gain
    light: tuple[tuple[float, float, float], ...]  # (amplitude, period s, phase) terms
    shake: tuple[tuple[float, float, float, float], ...]  # (amp x, amp y, freq Hz, phase)

    def gain(self, t: float) -> float:
        """Global brightness at time t (slow drift, like clouds or auto-exposure)."""
        return 1.0 + sum(a * math.sin(2 * math.pi * t / p + ph) for a, p, ph in self.light)

    def offset(self, t: float) -> tuple[int, int]:
        """Camera shake at time t in whole pixels (smooth, not white noise, like a robot)."""
        dx = sum(ax * math.sin(2 * math.pi * f * t + ph) for ax, _, f, ph in self.shake)
        dy = sum(ay * math.cos(2 * math.pi * f * t + ph) for _, ay, f, ph in self.shake)
        return _clamp_shake(dx), _clamp_shake(dy)


def _clamp_shake(v: float) -> int:
    return max(-SHAKE_PX, min(SHAKE_PX, round(v)))


@lru_cache(maxsize=16)
def _look(seed: int) -> _Look:
    """Build (once per seed) the static parts of the camera image."""
    rng = np.random.default_rng([seed, _LOOK_STREAM])
    h, w = HEIGHT + 2 * _MARGIN, WIDTH + 2 * _MARGIN
    # Neutral grey floor, brighter towards the camera, with low-frequency blotches and
    # faint tile seams: it looks like a floor yet stays unsaturated, so objects pop out.
    grey = rng.uniform(105, 135)
    rows = np.linspace(0.88, 1.08, h, dtype=np.float32)[:, None, None]
    blotch = cv2.resize(rng.normal(0, 5, (6, 8)).astype(np.float32), (w, h),
                        interpolation=cv2.INTER_CUBIC)[:, :, None]
    floor = grey * rows * np.array([1.02, 1.0, 0.97], np.float32) + blotch
    tile = int(rng.integers(140, 180))
    floor[:, int(rng.integers(tile))::tile] -= 10
    floor[int(rng.integers(tile))::tile, :] -= 10
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    rr = ((xx - WIDTH / 2) ** 2 + (yy - HEIGHT / 2) ** 2) / ((WIDTH / 2) ** 2 + (HEIGHT / 2) ** 2)
    light = (
        (rng.uniform(0.08, 0.14), rng.uniform(40, 90), rng.uniform(0, 2 * math.pi)),
        (rng.uniform(0.02, 0.05), rng.uniform(7, 15), rng.uniform(0, 2 * math.pi)),
    )
    shake = (
        (rng.uniform(1.2, 2.0), rng.uniform(0.8, 1.5), rng.uniform(0.3, 0.6), rng.uniform(0, 6.3)),
        (rng.uniform(0.5, 1.0), rng.uniform(0.5, 1.0), rng.uniform(1.1, 1.9), rng.uniform(0, 6.3)),
    )
    return _Look(
        floor=np.clip(floor, 0, 255).astype(np.uint8),
        vignette=(1.0 - 0.18 * rr)[:, :, None],
        light=light,
        shake=shake,
    )


def _fixed(points: np.ndarray) -> np.ndarray:
    return np.round(points * (1 << _SUBPIXEL_BITS)).astype(np.int32)


def _draw(canvas: np.ndarray, obj: Drawable, dx: int, dy: int) -> None:
    """Draw one filled, anti-aliased shape; (dx, dy) is the camera shake to undo."""
    cx, cy, r = obj.x - dx, obj.y - dy, obj.radius
    rgb = COLOURS[obj.colour]
    if obj.shape == "circle":
        centre = tuple(int(v) for v in _fixed(np.array([cx, cy])))
        cv2.circle(canvas, centre, int(round(r * (1 << _SUBPIXEL_BITS))), rgb, -1,
                   cv2.LINE_AA, _SUBPIXEL_BITS)
        return
    if obj.shape == "square":
        s = _SQUARE_HALF * r
        polys = [np.array([[-s, -s], [s, -s], [s, s], [-s, s]])]
    elif obj.shape == "triangle":  # point up, centred on its centroid
        angles = np.radians([-90.0, 30.0, 150.0])
        polys = [BOUND * r * np.stack([np.cos(angles), np.sin(angles)], axis=1)]
    else:  # cross: two bars
        a, b = _CROSS_HALF_LENGTH * r, _CROSS_HALF_WIDTH * r
        polys = [np.array([[-a, -b], [a, -b], [a, b], [-a, b]]),
                 np.array([[-b, -a], [b, -a], [b, a], [-b, a]])]
    for poly in polys:  # one call each: a single call fills the bars' overlap even-odd, a hole
        cv2.fillPoly(canvas, [_fixed(poly + [cx, cy])], rgb, cv2.LINE_AA, _SUBPIXEL_BITS)


def render_frame(seed: int, t: float, objects: Sequence[Drawable]) -> np.ndarray:
    """Render the objects in view at time t as a (480, 640, 3) uint8 RGB camera frame."""
    look = _look(seed)
    dx, dy = look.offset(t)
    canvas = look.floor[_MARGIN + dy:_MARGIN + dy + HEIGHT, _MARGIN + dx:_MARGIN + dx + WIDTH].copy()
    for obj in objects:
        _draw(canvas, obj, dx, dy)
    # A slight optical blur before the sensor effects, as in a real lens + sensor chain.
    image = cv2.GaussianBlur(canvas, (0, 0), 0.8).astype(np.float32)
    image *= look.vignette * np.float32(look.gain(t))
    rng = np.random.default_rng([seed, _NOISE_STREAM, round(t * 1e6)])
    image += rng.standard_normal(image.shape, dtype=np.float32) * np.float32(NOISE_SIGMA)
    return np.clip(image + 0.5, 0, 255).astype(np.uint8)
