"""The ``Model`` protocol: the whole surface a backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from .events import StreamEvent
from .types import Request, Response


@runtime_checkable
class Model(Protocol):
    """A language model behind the port.

    ``generate`` returns one assistant turn; ``stream`` yields events that assemble
    (``events.assemble``) into exactly the same ``Response``. Implementations are safe for
    concurrent use and raise ``LLMError`` with a fault class. Cancellation is the caller's
    anyio cancel scope: cancelling it aborts the in-flight HTTP request.
    """

    @property
    def name(self) -> str:
        """The model id sent to the provider (e.g. ``claude-sonnet-4-5``)."""
        ...

    @property
    def provider(self) -> str:
        """The provider key (``anthropic``, ``openai``, ``scripted``...)."""
        ...

    async def generate(self, request: Request) -> Response: ...

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]: ...
