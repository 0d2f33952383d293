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
    names = setting_names(name)
    unknown = set(settings) - set(names)
    if unknown:
        raise ValueError(f"policy {name!r} has no setting {sorted(unknown)}; its settings are {names}")
    return policy_class(name)(**settings)


def setting_names(name: str) -> list[str]:
    """The settings policy `name` has: its dataclass fields."""
    return [field.name for field in dataclasses.fields(policy_class(name))]


def policy_settings(name: str, offered: dict) -> dict:
    """Of the settings `offered`, the ones policy `name` has."""
    names = setting_names(name)
    return {key: value for key, value in offered.items() if key in names}


__all__ = ["CachePolicy", "FullCache", "StreamingWindow", "HeavyHitters", "AttentionSaddles",
           "POLICIES", "make_policy", "policy_class", "policy_settings", "setting_names", "local_sum"]
