"""A ``Model`` built at its first use: for callers that must accept a model before they may
need one (a conversation constructed without a key, a command whose pattern may have no
dialog). Subclasses say how to build it (``_build``); every call then goes to that model."""

from __future__ import annotations

from collections.abc import AsyncIterator

from .events import StreamEvent
from .model import Model
from .types import Request, Response

__all__ = ["DeferredModel"]


class DeferredModel:
    """Builds its model once, at the first ``name``, ``provider``, ``generate`` or ``stream``;
    an error building it surfaces there (as a model failure of that call)."""

    _model: Model | None = None

    def _build(self) -> Model:
        raise NotImplementedError

    def _get(self) -> Model:
        if self._model is None:
            self._model = self._build()
        return self._model

    @property
    def name(self) -> str:
        return self._get().name

    @property
    def provider(self) -> str:
        return self._get().provider

    async def generate(self, request: Request) -> Response:
        return await self._get().generate(request)

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        return self._get().stream(request)

    async def aclose(self) -> None:
        """Release what the built model holds (an adapter's HTTP client); nothing if it was
        never built."""
        aclose = getattr(self._model, "aclose", None)
        if callable(aclose):
            await aclose()
