"""The phases of one `infmllm-train-tiny` run, each with its own learning-rate cycle and data.

The first phase (short windows, then long and gapped ones) and the long phase (windows shaped like
a 10-minute stream) are what a run always had. `--rounds` adds, after them, what the shipped
weights were made of as a chain of separate runs (README, item 15 of the embedded model): a drill
of one lookup on short windows with the attention pointed hard at the asked object, then a
long-stream fine-tune asking the memory kinds in turn. One command, one optimizer, one checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    """A stretch of optimizer steps; `windows` says what they read: "first" (short windows, then the
    first phase's mix), "long" (mostly scattered windows) or "short" (short windows only)."""

    name: str
    start: int
    steps: int
    lr: float
    windows: str
    side_kinds: frozenset[str] = frozenset()
    balance_kinds: bool = False
    retrieval_weight: float = 0.0

    @property
    def end(self) -> int:
        return self.start + self.steps


def plan(args) -> list[Phase]:
    """Every phase of the run `args` describe, in order; phases of no steps are left out."""
    phases = [Phase("first", 0, args.steps, args.lr, "first", args.side_kinds, args.balance_kinds,
                    args.retrieval_weight)]
    phases.append(Phase("long", phases[-1].end, args.long_steps, args.long_lr, "long", args.side_kinds,
                        args.balance_kinds, args.retrieval_weight))
    for number in range(1, args.rounds + 1):
        phases.append(Phase(f"drill {number}", phases[-1].end, args.drill_steps, args.drill_lr, "short",
                            args.drill_kinds, False, args.drill_retrieval_weight))
        # kind by kind: asking the rarer "what colour was the <shape>?" as often as the others is
        # what moved it on ten-minute streams (run Z11 against Z9)
        phases.append(Phase(f"fine-tune {number}", phases[-1].end, args.round_steps, args.long_lr, "long",
                            frozenset(), True, args.retrieval_weight))
    return [phase for phase in phases if phase.steps > 0]


def total_steps(phases: list[Phase]) -> int:
    return phases[-1].end if phases else 0


def phase_at(phases: list[Phase], step: int) -> Phase:
    """The phase optimizer step `step` belongs to (the last one past the end)."""
    return next((phase for phase in phases if step < phase.end), phases[-1])


def cycle(step: int, steps: int) -> float:
    """Share of a phase's peak learning rate at `step`: linear warm-up over a 40th, cosine to 0.1."""
    warmup = max(steps // 40, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(steps, 1)))
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * cosine)


def learning_rate(phases: list[Phase], step: int) -> float:
    """The rate at optimizer step `step`: its phase's own cycle, peaking at the phase's rate."""
    phase = phase_at(phases, step)
    return phase.lr * cycle(step - phase.start, phase.steps)
