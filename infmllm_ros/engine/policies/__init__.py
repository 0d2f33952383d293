"""Cache policies by name: one class per method, one place that builds them from settings."""

from __future__ import annotations

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
    return policy_class(name)(**settings)


__all__ = ["CachePolicy", "FullCache", "StreamingWindow", "HeavyHitters", "AttentionSaddles",
           "POLICIES", "make_policy", "policy_class", "local_sum"]
