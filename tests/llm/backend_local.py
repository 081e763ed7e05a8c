"""The embedded model for the local tests: ``LocalModel`` on the default weights, recording the
exact prompt of every request (what the HTTP backends' fakes record as request bytes).

A real model cannot be scripted, so this is not a ``harness.Backend``: ``test_local_contract``
holds ``LocalModel`` to the contract suite part by part, and lists what it cannot honour.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed: pip install -e '.[local]' "
    "(CI installs it, so these tests run there)")

from runtime.llm import Request, Sampling, StreamEvent  # noqa: E402
from runtime.llm.providers.local import LocalModel  # noqa: E402

GREEDY = Sampling(temperature=0.0)


class RecordingLocalModel(LocalModel):
    """``LocalModel``, noting each request and the prompt text it became (``generate``
    goes through ``stream``, so each call is noted once)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.requests: list[Request] = []
        self.prompts: list[str] = []

    async def _record(self, request: Request) -> None:
        self.requests.append(request)
        self.prompts.append(await self.prompt(request))

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        await self._record(request)
        async for event in super().stream(request):
            yield event


def local_model(**kw: Any) -> RecordingLocalModel:
    """A model on the default weights (one load per process, whatever the instance)."""
    return RecordingLocalModel(**kw)


def tokens(model: LocalModel, text: str) -> int:
    """How many tokens the model's tokenizer makes of a prompt."""
    from runtime.llm.providers.local import _engine

    llm = _engine(model._key).llm
    return len(llm.tokenize(text.encode(), add_bos=False, special=True))
