"""Fault classification for model calls: what to retry and what to give up on at once.

The port's two error classes, both ``runtime.errors.CelldialogError``:

- ``LLMError``: a model call failed; ``fault`` says whether retrying can help.
- ``ConfigurationError`` (also a ``ValueError``): an unknown model name, a missing key, a
  base URL or key that is unsafe or unusable.

A server's refusal is classified from its status and, for the one status that cannot tell a
rate limit from an empty wallet (429, also an in-stream error), from what it says:
``quota_exhausted`` is the one reading of that text, shared by every adapter.
"""

from __future__ import annotations

import re
from enum import StrEnum

from ..errors import CelldialogError

MAX_MESSAGE_CHARS = 1000
"""The longest ``LLMError.message``: a longer one (a server's 50 MB error page) is cut, and
says so. Adapters remove the API key *before* cutting, so no fragment of it survives."""

_CUT = " [... truncated]"


def cap_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` if it fits in ``limit`` characters, else its start marked as truncated."""
    if len(text) <= limit:
        return text
    return text[: max(limit - len(_CUT), 0)] + _CUT


class Fault(StrEnum):
    TRANSIENT = "transient"  # retry with backoff: rate limits, overload, 5xx, dropped connections
    TERMINAL = "terminal"  # fail now: bad request, auth, exhausted quota, broken server, script


def retry_class(status: int, quota_exhausted: bool = False) -> Fault:
    """Classify an HTTP status from a model API.

    5xx (529 included) and 429 are transient, except a 429 that signals an exhausted quota or a
    billing problem: that one never heals by waiting, so it is terminal and fails fast.
    ``quota_exhausted`` carries the provider's own signal (``quota_exhausted()`` reads it),
    since the status alone cannot tell a rate limit from an empty wallet. Every other status
    is terminal.
    """
    if status == 429:
        return Fault.TERMINAL if quota_exhausted else Fault.TRANSIENT
    if 500 <= status <= 599:
        return Fault.TRANSIENT
    return Fault.TERMINAL


# Error codes / types that mean "the account cannot pay", whatever the message says.
QUOTA_CODES = frozenset({
    "insufficient_quota",  # OpenAI
    "billing_hard_limit_reached",  # OpenAI
    "billing_not_active",  # OpenAI
    "billing_error",  # Anthropic
})
# Phrases that mean the same in the message itself, even next to rate-limit words.
_NO_MONEY = re.compile(
    r"insufficient[ _]quota|exceeded your current quota|credit balance|billing[ _]hard[ _]limit",
    re.I,
)
# A limit over a short window: waiting heals it.
_RATE = re.compile(
    r"rate[ _-]?limit|\b(tokens|requests) per\b|per (second|sec|minute|min|hour)\b"
    r"|\b[tr]p[smd]\b",
    re.I,
)
# Words that suggest money when nothing says "rate": a quota, billing, a spend limit.
_MONEY_WORDS = re.compile(r"quota|billing|payment|spend(ing)? limit|usage limit", re.I)


def quota_exhausted(message: str, *codes: str | None) -> bool:
    """Whether a refusal means the account cannot pay (terminal) rather than "slow down"
    (transient). In order:

    1. a code or type in ``QUOTA_CODES`` (``insufficient_quota``, ``billing_error``...): yes;
    2. a message saying so outright ("exceeded your current quota", "credit balance",
       "insufficient_quota", "billing hard limit"): yes;
    3. a message about a rate ("rate limit", "tokens per minute", "requests per min", "TPM"):
       no, even if it mentions a quota or billing ("tokens per minute quota exceeded", a rate
       limit pointing at the billing page);
    4. otherwise any of "quota", "billing", "payment", "spend limit", "usage limit": yes.
    """
    if any(c in QUOTA_CODES for c in codes if c):
        return True
    if _NO_MONEY.search(message):
        return True
    if _RATE.search(message):
        return False
    return bool(_MONEY_WORDS.search(message))


class LLMError(CelldialogError):
    """An error raised by the port. Never carries an API key.

    ``fault`` says whether a retry may help; ``provider`` and ``status`` say where it came
    from (``status`` is None for transport faults); ``retry_after`` is the server's hint in
    seconds when it sent one. ``message`` is at most ``MAX_MESSAGE_CHARS`` long. ``attempts``
    is how many attempts the retry layer made before giving up (None when no retry layer was
    involved); ``str()`` says it when there was more than one.
    """

    def __init__(
        self,
        message: str,
        *,
        fault: Fault,
        provider: str,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        message = cap_message(message)
        super().__init__(message)
        self.message = message
        self.fault = Fault(fault)
        self.provider = provider
        self.status = status
        self.retry_after = retry_after
        self.attempts: int | None = None

    @property
    def transient(self) -> bool:
        return self.fault is Fault.TRANSIENT

    def __str__(self) -> str:
        where = f"{self.provider} {self.status}" if self.status is not None else self.provider
        tries = f" (after {self.attempts} attempts)" if (self.attempts or 0) > 1 else ""
        return f"{where} ({self.fault.value}): {self.message}{tries}"

    def __repr__(self) -> str:
        return (
            f"LLMError(provider={self.provider!r}, status={self.status!r}, "
            f"fault={self.fault.value!r}, message={self.message!r})"
        )


class ConfigurationError(CelldialogError, ValueError):
    """Bad configuration: an unknown model name, a missing key, an unsafe or unusable base
    URL, an API key that cannot go in an HTTP header."""
