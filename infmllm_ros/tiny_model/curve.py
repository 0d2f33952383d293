"""The training curve as a PNG: teacher-forced validation accuracy per family, and the loss."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from infmllm_ros.synthetic import FAMILIES  # noqa: E402


def plot_training_curve(record: dict, path: Path) -> None:
    history = record["validation"]
    if not history:
        return
    steps = [row["step"] for row in history]
    figure, (accuracy, loss) = plt.subplots(1, 2, figsize=(10, 4))
    for family in FAMILIES:
        accuracy.plot(steps, [100 * row[family] for row in history], marker="o", label=family)
    accuracy.set(xlabel="step", ylabel="validation accuracy (%, teacher forced)", ylim=(0, 100),
                 title="answers per family")
    accuracy.legend()
    loss.plot(steps, [row["loss"] for row in history], marker="o", color="black")
    loss.set(xlabel="step", ylabel="training loss (smoothed)", yscale="log", title="loss")
    for phase in record.get("phases", [])[1:]:   # where each phase (its own rate cycle) begins
        for axes in (accuracy, loss):
            axes.axvline(phase["start"], color="grey", linewidth=0.6, linestyle=":")
        accuracy.annotate(phase["name"], (phase["start"], 2), rotation=90, fontsize=7, color="dimgrey")
    # a resumed run shows each command it ran under, with the step it started from
    figure.suptitle("\n".join(record.get("commands") or [record.get("command", "")]), fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
