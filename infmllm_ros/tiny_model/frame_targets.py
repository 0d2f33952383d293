"""Dense training targets on every frame: what each frame shows and what has just left the view.

Questions are the only signal a streaming model gets about memory, and they are sparse: a
64-frame window holds a dozen "what left most recently?" answers and a few long-range ones. A
4-layer model trained on answers alone learnt neither in 5,000 steps (recent 14 %, long 29 %,
and even "what colour is the triangle?" about the current frame at 66 %). So during training
the last image tokens of each frame also predict, in the model's own vocabulary:

- for each shape, the colour of the one object of that shape in the frame ("zero" if none), the
  lookup a question about the scene, or a memory question keyed by shape, has to make;
- the colour and shape of the object that left the view most recently (when that is well
  defined and its frames are in the window), so every frame teaches the exit detection that
  "what left most recently?" needs, instead of one question in three seconds.

These are auxiliary losses only: inference never reads logits at image tokens, the saved model is
the same standard LLaVA, and the questions are asked exactly as in evaluation.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from infmllm_ros.synthetic import COLOURS, FEED_RATE_HZ, SHAPES, generate_episode
from infmllm_ros.synthetic.questions import RECENT_AFTER_S, RECENT_CLEAR_S

from .architecture import IMAGE_TOKENS

#: words each frame predicts, in order, at its last TARGETS_PER_FRAME image tokens
TARGETS_PER_FRAME = len(SHAPES) + 2
FIRST_TARGET_TOKEN = 1 + IMAGE_TOKENS - TARGETS_PER_FRAME   # index within "<frame>" + image tokens
_COLOUR_NAMES = list(COLOURS)


@lru_cache(maxsize=512)
def _exits(seed: int, duration_s: float) -> tuple[tuple[float, float, str, str], ...]:
    """(t_enter, t_exit, colour, shape) of every object of the episode, by exit time."""
    episode = generate_episode(seed, duration_s)
    return tuple(sorted(((o.t_enter, o.t_exit, o.colour, o.shape) for o in episode.objects),
                        key=lambda row: row[1]))


def frame_words(stream, index: int, shown_before: np.ndarray) -> list[str | None]:
    """The TARGETS_PER_FRAME words frame `index` of a rendered stream should predict (None = no
    target), given the times of the frames the window showed before it."""
    objects = stream.objects[index]
    if objects is None:     # an object half in view: neither target is well defined
        return [None] * TARGETS_PER_FRAME
    words: list[str | None] = []
    for shape in range(len(SHAPES)):
        matching = [o for o in objects if o[1] == shape]
        words.append("zero" if not matching else _COLOUR_NAMES[matching[0][0]] if len(matching) == 1 else None)
    return words + _last_left(stream, float(stream.frame_times[index]), shown_before)


def _last_left(stream, t: float, shown_before: np.ndarray) -> list[str | None]:
    """Colour and shape of what left most recently, by the same rules as the "recent" questions
    (but from the first frame after the exit on), if the window showed it."""
    duration = round(len(stream.frame_times) / FEED_RATE_HZ)
    gone = [row for row in _exits(stream.seed, duration) if row[1] <= t]
    if not gone:
        return [None, None]
    t_enter, t_exit, colour, shape = gone[-1]
    if t - t_exit > RECENT_AFTER_S[1] or (len(gone) > 1 and gone[-2][1] > t_exit - RECENT_CLEAR_S):
        return [None, None]
    if not ((shown_before >= t_enter) & (shown_before < t_exit)).any():
        return [None, None]
    return [colour, shape]
