"""Fault classification for model calls: what to retry and what to give up on at once."""

from __future__ import annotations

from enum import StrEnum

from ..errors import CelldialogError


class Fault(StrEnum):
    TRANSIENT = "transient"  # retry with backoff: rate limits, overload, 5xx, dropped connections
    TERMINAL = "terminal"  # fail now: bad request, auth, exhausted quota, script used up


def retry_class(status: int, quota_exhausted: bool = False) -> Fault:
    """Classify an HTTP status from a model API.

    5xx (529 included) and 429 are transient, except a 429 that signals an exhausted quota or a
    billing problem: that one never heals by waiting, so it is terminal and fails fast.
    ``quota_exhausted`` carries the provider's own signal, since the status alone cannot tell
    a rate limit from an empty wallet. Every other status is terminal.
    """
    if status == 429:
        return Fault.TERMINAL if quota_exhausted else Fault.TRANSIENT
    if 500 <= status <= 599:
        return Fault.TRANSIENT
    return Fault.TERMINAL


class LLMError(CelldialogError):
    """An error raised by the port. Never carries an API key.

    ``fault`` says whether a retry may help; ``provider`` and ``status`` say where it came
    from (``status`` is None for transport faults); ``retry_after`` is the server's hint in
    seconds when it sent one.
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
        super().__init__(message)
        self.message = message
        self.fault = Fault(fault)
        self.provider = provider
        self.status = status
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        return self.fault is Fault.TRANSIENT

    def __str__(self) -> str:
        where = f"{self.provider} {self.status}" if self.status is not None else self.provider
        return f"{where} ({self.fault.value}): {self.message}"

    def __repr__(self) -> str:
        return (
            f"LLMError(provider={self.provider!r}, status={self.status!r}, "
            f"fault={self.fault.value!r}, message={self.message!r})"
        )


class ConfigurationError(CelldialogError, ValueError):
    """Bad configuration: an unknown model name, a missing key, an unsafe base URL."""
