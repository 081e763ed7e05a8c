"""Script steps shared by every backend of the contract suite.

A backend's ``script(*steps)`` takes, per expected model call, one of: a ``Response`` (the
reply to give, streamed or not as the request asks), or one of the fault steps below. The
scripted backend maps them onto ``ScriptedModel`` steps; the loopback fakes render them in
their provider's wire format.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.llm.types import Response


@dataclass(frozen=True)
class HTTPError:
    """Answer with an HTTP error. ``kind`` picks the provider's error body:
    "rate_limit", "quota" (exhausted quota / billing), "overloaded", "server", "bad_request",
    "auth"."""

    status: int
    kind: str = "server"
    retry_after: float | None = None
    message: str = "injected failure"


@dataclass(frozen=True)
class DropMidStream:
    """Stream ``after_events`` wire events of ``response``, then drop the connection."""

    response: Response
    after_events: int = 2


@dataclass(frozen=True)
class MalformedEvent:
    """Stream ``after_events`` wire events of ``response``, then an SSE event whose data is
    not JSON."""

    response: Response
    after_events: int = 1


@dataclass(frozen=True)
class Hang:
    """Send the response headers and ``after_events`` events, then wait until the client
    goes away (for cancellation tests). The fake records that the connection closed."""

    response: Response
    after_events: int = 1


Step = Response | HTTPError | DropMidStream | MalformedEvent | Hang
