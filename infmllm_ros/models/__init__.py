"""Model directories shipped with the package (installed as package data)."""

from __future__ import annotations

from pathlib import Path

EMBEDDED_MODEL_NAME = "tiny_llava"


def embedded_model_path() -> Path:
    """The tiny model trained here on synthetic camera streams: the default when no model_path is set."""
    return Path(__file__).resolve().parent / EMBEDDED_MODEL_NAME
