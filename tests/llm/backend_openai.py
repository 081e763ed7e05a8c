"""The OpenAI adapter against ``FakeOpenAI``, as a contract-suite ``Backend``.

Request bytes are read by position (``jsonspans``), not re-serialised, so
``prefix_bytes`` and ``replayed_opaque`` report exactly what went over the wire.

An OpenAI opaque block is one content part spliced verbatim, and it may well look like a part
the adapter writes itself (``{"type":"text",...}``), so the bytes alone cannot say which parts
were opaque. The backend's models therefore record the port requests they are given, and
``replayed_opaque`` looks in the bytes for the opaque parts of the request that produced them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from runtime.llm import OpaqueBlock, Request, Response, RetryPolicy, StreamEvent
from runtime.llm.providers.openai import OpenAIModel, encode_request

from .fake_openai import FakeOpenAI
from .harness import CacheLayout, FakeServerRecords
from .jsonspans import Span, items, members, skip
from .steps import Step

API_KEY = "sk-test-0penai-fake-key-9f8e7d6c5b4a"
MODEL = "gpt-test"


def _port_message_ends(text: str, messages: list[Span]) -> tuple[int | None, list[int]]:
    """Where the system prompt's encoding ends (None without one), and where each port
    message's does.

    The adapter writes one port message as one wire message, except a user message with tool
    results: its ``tool`` messages, then optionally one ``user`` message. So a run of ``tool``
    messages and the ``user`` message right after it are one port message. A leading
    ``system`` wire message is taken for the request's system prompt.
    """
    roles = [json.loads(text[a:b])["role"] for a, b in messages]
    system = messages[0][1] if roles[:1] == ["system"] else None
    ends: list[int] = []
    i = 0 if system is None else 1
    while i < len(roles):
        if roles[i] == "tool":
            while i + 1 < len(roles) and roles[i + 1] == "tool":
                i += 1
            if i + 1 < len(roles) and roles[i + 1] == "user":
                i += 1
        ends.append(messages[i][1])
        i += 1
    return system, ends


class _RecordingModel(OpenAIModel):
    """The adapter, noting each port request it is asked."""

    def __init__(self, asked: list[Request], **kw: Any) -> None:
        super().__init__(MODEL, **kw)
        self._asked = asked

    async def generate(self, request: Request) -> Response:
        self._asked.append(request)
        return await super().generate(request)

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        self._asked.append(request)
        return super().stream(request)


class OpenAIBackend(FakeServerRecords):
    name = "openai"

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self._asked: list[Request] = []

    def script(self, *steps: Step) -> None:
        self.fake.script(*steps)

    def model(self, *, retry: RetryPolicy | None = None) -> OpenAIModel:
        return _RecordingModel(
            self._asked, api_key=API_KEY, base_url=self.fake.base_url, retry=retry
        )

    def _request(self, index: int) -> Request:
        """The port request that wire request ``index`` encodes (retries repeat one)."""
        raw = self.fake.requests[index].raw
        for request in self._asked:
            for stream in (False, True):
                # A loopback server gets the output ceiling as ``max_tokens``.
                if encode_request(MODEL, request, stream=stream, ceiling="max_tokens") == raw:
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
        puts ``model`` and ``tools`` before ``messages``, so this is a true byte prefix."""
        text, fields = self._text(index)
        messages = items(text, fields["messages"][0])
        system, ends = _port_message_ends(text, messages)
        if stable_messages > len(ends):
            raise IndexError(f"request {index} has only {len(ends)} messages")
        if stable_messages:
            end = ends[stable_messages - 1]
        elif system is not None:
            end = system
        else:
            end = skip(text, fields["messages"][0]) + 1  # just past "["
        return text[:end].encode()

    def _parts(self, index: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(raw text, parsed) of every content part of every message in request ``index``."""
        text, fields = self._text(index)
        for a, _ in items(text, fields["messages"][0]):
            content = members(text, a).get("content")
            if content and text[content[0]] == "[":
                for p, q in items(text, content[0]):
                    yield text[p:q], json.loads(text[p:q])

    def replayed_opaque(self, index: int) -> list[str]:
        """The request's OpenAI opaque blocks that are, verbatim, content parts on the wire
        (other providers' blocks are dropped by the adapter, so never listed)."""
        parts = [raw for raw, _ in self._parts(index)]
        out = []
        for message in self._request(index).messages:
            for block in message.blocks:
                if isinstance(block, OpaqueBlock) and block.provider == self.name:
                    if block.raw in parts:
                        parts.remove(block.raw)
                        out.append(block.raw)
        return out

    def images(self, index: int) -> list[tuple[str, bytes]]:
        out = []
        for _, part in self._parts(index):
            if part.get("type") == "image_url":
                head, _, data = part["image_url"]["url"].partition(",")
                media_type = head.removeprefix("data:").removesuffix(";base64")
                out.append((media_type, base64.b64decode(data)))
        return out


@contextmanager
def make_backend(*, interleave_tool_calls: bool = False) -> Iterator[OpenAIBackend]:
    with FakeOpenAI(interleave_tool_calls=interleave_tool_calls) as fake:
        yield OpenAIBackend(fake)
