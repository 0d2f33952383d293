"""Cache policies by name: one class per method, one place that builds them from settings."""

from __future__ import annotations

import dataclasses

from .base import CachePolicy
from .full import FullCache
from .h2o import HeavyHitters
from .infmllm import AttentionSaddles, local_sum
from .streaming import StreamingWindow

POLICIES: dict[str, type[CachePolicy]] = {
    cls.name: cls for cls in (FullCache, StreamingWindow, HeavyHitters, AttentionSaddles)
}


def policy_class(name: str) -> type[CachePolicy]:
    """The policy class of `name`; an unknown name fails here, with the valid choices."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown cache policy {name!r}; choose one of {sorted(POLICIES)}") from None


def make_policy(name: str, **settings) -> CachePolicy:
    """Build a policy by name; unknown names and bad settings fail here, with the valid choices."""
    cls = policy_class(name)
    unknown = set(settings) - {field.name for field in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"policy {name!r} has no setting {sorted(unknown)}; its settings are "
                         f"{[field.name for field in dataclasses.fields(cls)]}")
    return cls(**settings)


def policy_settings(name: str, offered: dict) -> dict:
    """Of the settings `offered`, the ones policy `name` has (its dataclass fields)."""
    fields = {field.name for field in dataclasses.fields(policy_class(name))}
    return {key: value for key, value in offered.items() if key in fields}


__all__ = ["CachePolicy", "FullCache", "StreamingWindow", "HeavyHitters", "AttentionSaddles",
           "POLICIES", "make_policy", "policy_class", "policy_settings", "local_sum"]
