"""A small catalog of known models: limits, prices, aliases and each provider's small sibling.

Deliberately short: it lists models whose limits are documented, so callers can budget a
context, estimate a cost and pick a cheap helper model. A model missing from it still works;
its limits and price are simply unknown (``context_window is None``, ``price is None``).

Prices are the providers' standard (pay-as-you-go, non-batch) list prices in US dollars per
million tokens, as each provider published them (the comments say where they were read);
they change, so treat them as an estimate and check the provider's page before budgeting.
A price or part of one that could not be sourced is ``None``, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens: fresh input, output, and input read from the prompt
    cache (``None`` where unknown). With ``Usage``'s meaning of ``input_tokens`` (the total,
    cache hits included), a call costs ``(input_tokens - cache_read_tokens) * input +
    cache_read_tokens * cached_input + output_tokens * output``, over a million; cache writes
    (Anthropic charges them extra) are not in this table."""

    input: float
    output: float
    cached_input: float | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What we know about one model; ``None`` means unknown, not unlimited (nor free)."""

    name: str
    provider: str | None
    context_window: int | None = None
    max_output: int | None = None
    aliases: tuple[str, ...] = ()
    price: Price | None = None


# Anthropic: the pricing page (platform.claude.com/docs/en/about-claude/pricing, "Model
# pricing": base input, cache hits, output); cache hits are 0.1x the base input price there.
# OpenAI: the pricing page (developers.openai.com/api/docs/pricing, standard tier), which was
# not readable here: read from copies of it (GitHub's Copilot model pricing table for gpt-4.1
# and gpt-5-mini, the adk-model crate's price table for the rest) and cross-checked between
# them. Gemini: the Gemini Developer API pricing page (ai.google.dev/gemini-api/docs/pricing,
# paid tier; 2.5 Pro's is for prompts up to 200k tokens, $2.50 / $15 above), as quoted by
# api-evangelist/gemini's transcription of it and by morphllm.com's table; cached-input
# prices were not found in a source that quoted the page, so they are None. Gemini 2.5's
# context and output limits: Google Cloud's model pages (maximum input / output tokens).
MODELS: tuple[ModelInfo, ...] = (
    ModelInfo("claude-opus-4-5", "anthropic", 200_000, 64_000, ("opus",), Price(5, 25, 0.5)),
    ModelInfo("claude-sonnet-4-5", "anthropic", 200_000, 64_000, ("sonnet", "claude"),
              Price(3, 15, 0.3)),
    ModelInfo("claude-haiku-4-5", "anthropic", 200_000, 64_000, ("haiku",), Price(1, 5, 0.1)),
    ModelInfo("claude-opus-4-1", "anthropic", 200_000, 32_000, (), Price(15, 75, 1.5)),
    ModelInfo("claude-sonnet-4-0", "anthropic", 200_000, 64_000, (), Price(3, 15, 0.3)),
    ModelInfo("gpt-5", "openai", 400_000, 128_000, ("gpt",), Price(1.25, 10, 0.125)),
    ModelInfo("gpt-5-mini", "openai", 400_000, 128_000, ("mini",), Price(0.25, 2, 0.025)),
    ModelInfo("gpt-5-nano", "openai", 400_000, 128_000, ("nano",), Price(0.05, 0.4, 0.005)),
    ModelInfo("gpt-4.1", "openai", 1_047_576, 32_768, (), Price(2, 8, 0.5)),
    ModelInfo("gpt-4.1-mini", "openai", 1_047_576, 32_768, (), Price(0.4, 1.6, 0.1)),
    ModelInfo("gpt-4o", "openai", 128_000, 16_384, (), Price(2.5, 10, 1.25)),
    ModelInfo("gpt-4o-mini", "openai", 128_000, 16_384, (), Price(0.15, 0.6, 0.075)),
    ModelInfo("o3", "openai", 200_000, 100_000, (), Price(2, 8, 0.5)),
    ModelInfo("o4-mini", "openai", 200_000, 100_000, (), Price(1.1, 4.4, 0.275)),
    ModelInfo("gemini-2.5-pro", "gemini", 1_048_576, 65_536, (), Price(1.25, 10)),
    ModelInfo("gemini-2.5-flash", "gemini", 1_048_576, 65_536, ("flash",), Price(0.3, 2.5)),
    ModelInfo("gemini-2.5-flash-lite", "gemini", 1_048_576, 65_536, ("flash-lite",),
              Price(0.1, 0.4)),
)

SMALL_MODELS: dict[str, str] = {
    "anthropic": "claude-haiku-4-5",
    "openai": "gpt-5-mini",
    "openai-responses": "gpt-5-mini",
    "gemini": "gemini-2.5-flash-lite",
}
"""The cheap, fast sibling of each provider, for helper calls (titles, summaries). Azure
deployments and the compatible servers' models are named by their owners: none is known."""

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
