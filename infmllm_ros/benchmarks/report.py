"""Markdown tables, JSON and PNG plots for benchmark results, written under bench/results/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

RESULTS_DIR = Path("bench/results")


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    def cell(value) -> str:
        return f"{value:.2f}" if isinstance(value, float) else str(value)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_json(name: str, payload, directory: Path = RESULTS_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def line_plot(name: str, rows: Sequence[dict], x: str, ys: Sequence[str], group: str,
              directory: Path = RESULTS_DIR, logx: bool = True, logy: bool = False) -> Path:
    """One panel per y metric, one line per group (e.g. per policy)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(1, len(ys), figsize=(4.2 * len(ys), 3.4), squeeze=False)
    for axis, y in zip(axes[0], ys):
        for label in dict.fromkeys(row[group] for row in rows):
            points = [(row[x], row[y]) for row in rows if row[group] == label]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        axis.set_xlabel(x)
        axis.set_ylabel(y)
        if logx:
            axis.set_xscale("log")
        if logy:
            axis.set_yscale("log")
        axis.grid(alpha=0.3)
    axes[0][0].legend()
    figure.tight_layout()
    path = directory / f"{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def bar_plot(name: str, rows: Sequence[dict], label: str, ys: Sequence[str], directory: Path = RESULTS_DIR) -> Path:
    """One panel per metric, one bar per row (e.g. per quantization mode)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(1, len(ys), figsize=(3.6 * len(ys), 3.2), squeeze=False)
    for axis, y in zip(axes[0], ys):
        axis.bar([str(row[label]) for row in rows], [row[y] for row in rows], color="tab:blue")
        axis.set_title(y)
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path = directory / f"{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def accuracy_plot(name: str, rows: Sequence[dict], families: Sequence[str], directory: Path = RESULTS_DIR) -> Path:
    """One panel per question family: accuracy against budget share per policy, with 95 % error
    bars, full's accuracy as a band across, evidence kept as dotted lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(1, len(families), figsize=(4.2 * len(families), 3.6), squeeze=False)
    full = next((row for row in rows if row["policy"] == "full"), None)
    for axis, family in zip(axes[0], families):
        if full is not None:
            axis.axhspan(full[f"lo_{family}"], full[f"hi_{family}"], color="grey", alpha=0.25, label="full (95 %)")
        for index, policy in enumerate(dict.fromkeys(r["policy"] for r in rows if r["policy"] != "full")):
            cells = [r for r in rows if r["policy"] == policy]
            x = [float(r["share"].rstrip(" %")) + 0.4 * (index - 1) for r in cells]
            y = [r[f"acc_{family}"] for r in cells]
            errors = [[r[f"acc_{family}"] - r[f"lo_{family}"] for r in cells],
                      [r[f"hi_{family}"] - r[f"acc_{family}"] for r in cells]]
            line = axis.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=policy)
            if f"kept_{family}" in cells[0]:
                axis.plot(x, [r[f"kept_{family}"] for r in cells], linestyle=":", color=line[0].get_color())
        axis.set(title=family, xlabel="budget (% of the stream)", ylabel="accuracy (%)", ylim=(0, 100))
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.text(0.5, 0.005, "dotted: share of the evidence still cached", ha="center", fontsize=8)
    figure.tight_layout()
    path = directory / f"{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def tradeoff_plot(name: str, lines: dict[str, Sequence[dict]], families: Sequence[str], x: str, label: str,
                  directory: Path = RESULTS_DIR) -> Path:
    """One panel per question family: accuracy (95 % error bars) against a cost `x`, one line per entry
    of `lines`, each point labelled with its `label` (e.g. the threshold that gave it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(1, len(families), figsize=(4.2 * len(families), 3.6), squeeze=False)
    for axis, family in zip(axes[0], families):
        for index, (line, rows) in enumerate(lines.items()):
            cells = [row for row in rows if row[f"n_{family}"]]
            if not cells:
                continue
            errors = [[r[f"acc_{family}"] - r[f"lo_{family}"] for r in cells],
                      [r[f"hi_{family}"] - r[f"acc_{family}"] for r in cells]]
            axis.errorbar([r[x] for r in cells], [r[f"acc_{family}"] for r in cells], yerr=errors, marker="o",
                          capsize=3, label=line, color=f"C{index}")   # one colour per line in every panel
            for r in cells:
                axis.annotate(f"{r[label]:g}", (r[x], r[f"acc_{family}"]), fontsize=6, xytext=(3, 3),
                              textcoords="offset points")
        axis.set(title=family, xlabel=x.replace("_", " "), ylabel="accuracy (%)", ylim=(0, 100))
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    path = directory / f"{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
