"""A small catalog of known models: limits, aliases and each provider's small sibling.

Deliberately short: it lists models whose limits are documented, so callers can budget a
context and pick a cheap helper model. A model missing from it still works; its limits are
simply unknown (``context_window is None``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelInfo:
    """What we know about one model; ``None`` means unknown, not unlimited."""

    name: str
    provider: str | None
    context_window: int | None = None
    max_output: int | None = None
    aliases: tuple[str, ...] = ()


MODELS: tuple[ModelInfo, ...] = (
    ModelInfo("claude-opus-4-5", "anthropic", 200_000, 64_000, ("opus",)),
    ModelInfo("claude-sonnet-4-5", "anthropic", 200_000, 64_000, ("sonnet", "claude")),
    ModelInfo("claude-haiku-4-5", "anthropic", 200_000, 64_000, ("haiku",)),
    ModelInfo("claude-opus-4-1", "anthropic", 200_000, 32_000),
    ModelInfo("claude-sonnet-4-0", "anthropic", 200_000, 64_000),
    ModelInfo("gpt-5", "openai", 400_000, 128_000, ("gpt",)),
    ModelInfo("gpt-5-mini", "openai", 400_000, 128_000, ("mini",)),
    ModelInfo("gpt-5-nano", "openai", 400_000, 128_000, ("nano",)),
    ModelInfo("gpt-4.1", "openai", 1_047_576, 32_768),
    ModelInfo("gpt-4.1-mini", "openai", 1_047_576, 32_768),
    ModelInfo("gpt-4o", "openai", 128_000, 16_384),
    ModelInfo("gpt-4o-mini", "openai", 128_000, 16_384),
    ModelInfo("o3", "openai", 200_000, 100_000),
    ModelInfo("o4-mini", "openai", 200_000, 100_000),
)

SMALL_MODELS: dict[str, str] = {"anthropic": "claude-haiku-4-5", "openai": "gpt-5-mini"}
"""The cheap, fast sibling of each provider, for helper calls (titles, summaries)."""

_BY_NAME = {m.name: m for m in MODELS}
_BY_ALIAS = {a: m for m in MODELS for a in m.aliases}
# Dated snapshots share their family's limits: claude-sonnet-4-5-20250929, gpt-4o-2024-08-06.
_SNAPSHOT = re.compile(r"^(?P<base>.+?)-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


def aliases() -> dict[str, str]:
    """Every alias and the model it stands for."""
    return {a: m.name for a, m in _BY_ALIAS.items()}


def by_alias(alias: str) -> ModelInfo | None:
    """The model an alias names, or None."""
    return _BY_ALIAS.get(alias.strip().lower())


def lookup(name: str) -> ModelInfo:
    """What the catalog knows of ``name`` (an id, a dated snapshot of one, or an alias).

    An unknown model gets a ``ModelInfo`` with no provider and no limits, so callers never
    need a special case for it.
    """
    key = name.strip()
    found = _BY_NAME.get(key) or by_alias(key)
    if found is not None:
        return found
    snapshot = _SNAPSHOT.match(key)
    family = _BY_NAME.get(snapshot["base"]) if snapshot else None
    if family is not None:
        return replace(family, name=key, aliases=())
    return ModelInfo(key, None)


def small_model(provider: str) -> str:
    """The small sibling model of ``provider`` (``KeyError`` for a provider without one)."""
    return SMALL_MODELS[provider]
