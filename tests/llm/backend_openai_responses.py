"""The OpenAI Responses adapter against ``FakeOpenAIResponses``, as a contract-suite
``Backend``.

Request bytes are read by position (``jsonspans``), not re-serialised, so ``prefix_bytes``
and ``replayed_opaque`` report exactly what went over the wire.

An opaque block of this provider is one input item spliced verbatim (a reasoning item),
and it may well look like an item the adapter writes itself, so the bytes alone cannot say
which items were opaque. The backend's models therefore record the port requests they are
given, and ``replayed_opaque`` looks in the bytes for the opaque items of the request that
produced them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from runtime.llm import OpaqueBlock, Request, Response, RetryPolicy, StreamEvent
from runtime.llm.providers.openai_responses import PROVIDER, OpenAIResponsesModel

from .fake_openai_responses import FakeOpenAIResponses
from .harness import CacheLayout, FakeServerRecords
from .jsonspans import Span, items, members, skip
from .steps import Step

API_KEY = "sk-test-0penai-responses-fake-1a2b3c4d5e"
MODEL = "gpt-5-test"
_USER_SIDE = {"user", "system", "developer"}


def _port_message_ends(text: str, spans: list[Span]) -> list[int]:
    """Where each port message's encoding ends in the ``input`` array.

    The adapter writes a user message as its ``function_call_output`` items then one user
    message, and an assistant message as assistant messages, ``function_call`` and opaque
    items; so a port message is a run of items of one side (user or system: the user side;
    the rest: the assistant's). The contract's conversations alternate sides.
    """
    ends: list[int] = []
    side: str | None = None
    for a, b in spans:
        item = json.loads(text[a:b])
        user = item.get("role") in _USER_SIDE or item.get("type") == "function_call_output"
        now = "user" if user else "assistant"
        if now == side:
            ends[-1] = b
        else:
            ends.append(b)
        side = now
    return ends


class _RecordingModel(OpenAIResponsesModel):
    """The adapter, noting each port request it is asked."""

    def __init__(self, asked: list[tuple[OpenAIResponsesModel, Request]], **kw: Any) -> None:
        super().__init__(MODEL, **kw)
        self._asked = asked

    async def generate(self, request: Request) -> Response:
        self._asked.append((self, request))
        return await super().generate(request)

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        self._asked.append((self, request))
        return super().stream(request)


class OpenAIResponsesBackend(FakeServerRecords):
    name = PROVIDER

    def __init__(self, fake: FakeOpenAIResponses) -> None:
        self.fake = fake
        self._asked: list[tuple[OpenAIResponsesModel, Request]] = []

    def script(self, *steps: Step) -> None:
        self.fake.script(*steps)

    def model(self, *, retry: RetryPolicy | None = None) -> OpenAIResponsesModel:
        return _RecordingModel(self._asked, api_key=API_KEY, base_url=self.fake.base_url,
                               retry=retry)

    def _request(self, index: int) -> Request:
        """The port request that wire request ``index`` encodes (retries repeat one)."""
        raw = self.fake.requests[index].raw
        for model, request in self._asked:
            for stream in (False, True):
                if model.encode(request, stream=stream) == raw:
                    return request
        raise LookupError(f"request {index} was not sent by this backend's models")

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def _text(self, index: int) -> tuple[str, dict[str, Span]]:
        text = self.fake.requests[index].raw.decode()
        return text, members(text, 0)

    def cache_layout(self, index: int) -> CacheLayout:
        # OpenAI caches prefixes automatically: no markers, only the routing key.
        return CacheLayout(
            prefix_marked=False,
            message_marker_after=None,
            key=self.sent()[index].get("prompt_cache_key"),
        )

    def prefix_bytes(self, index: int, stable_messages: int) -> bytes:
        """Everything up to the end of the ``stable_messages``-th port message. The adapter
        puts ``model``, ``tools`` and ``instructions`` before ``input``, so this is a true
        byte prefix."""
        text, fields = self._text(index)
        ends = _port_message_ends(text, items(text, fields["input"][0]))
        if stable_messages > len(ends):
            raise IndexError(f"request {index} has only {len(ends)} messages")
        if stable_messages:
            end = ends[stable_messages - 1]
        elif "instructions" in fields:
            end = fields["instructions"][1]
        else:
            end = skip(text, fields["input"][0]) + 1  # just past "["
        return text[:end].encode()

    def _items(self, index: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(raw text, parsed) of every input item of request ``index``."""
        text, fields = self._text(index)
        for a, b in items(text, fields["input"][0]):
            yield text[a:b], json.loads(text[a:b])

    def replayed_opaque(self, index: int) -> list[str]:
        """The request's opaque blocks of this provider that are, verbatim, input items on the
        wire (other providers' blocks are dropped by the adapter, so never listed)."""
        raws = [raw for raw, _ in self._items(index)]
        out = []
        for message in self._request(index).messages:
            for block in message.blocks:
                if isinstance(block, OpaqueBlock) and block.provider == self.name:
                    if block.raw in raws:
                        raws.remove(block.raw)
                        out.append(block.raw)
        return out

    def images(self, index: int) -> list[tuple[str, bytes]]:
        out = []
        for _, item in self._items(index):
            content = item.get("content")
            for part in content if isinstance(content, list) else []:
                if part.get("type") == "input_image":
                    head, _, data = part["image_url"].partition(",")
                    media_type = head.removeprefix("data:").removesuffix(";base64")
                    out.append((media_type, base64.b64decode(data)))
        return out


@contextmanager
def make_backend(*, reasoning_tokens: int = 0) -> Iterator[OpenAIResponsesBackend]:
    with FakeOpenAIResponses(reasoning_tokens=reasoning_tokens) as fake:
        yield OpenAIResponsesBackend(fake)
