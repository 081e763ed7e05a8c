"""The contract suite's Anthropic backend: ``AnthropicModel`` against ``FakeAnthropic``.

Byte-level questions (the cacheable prefix, replayed opaque blocks) are answered from the
exact bytes received, located with ``jsonspans`` rather than by re-encoding.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from runtime.llm import Model, RetryPolicy
from runtime.llm.providers.anthropic import AnthropicModel

from .fake_anthropic import FakeAnthropic, FakeStep
from .harness import CacheLayout, FakeServerRecords
from .jsonspans import items, members

API_KEY = "sk-ant-fake-0123456789abcdef"
MODEL = "claude-sonnet-4-5"
# The message-boundary marker moves forward every turn (Anthropic hashes content, not
# markers), so it is not part of the bytes a prompt cache reuses.
MESSAGE_MARKER = ',"cache_control":{"type":"ephemeral"}'
_PORT_BLOCKS = {"text", "tool_use", "tool_result", "image"}

class AnthropicBackend(FakeServerRecords):
    name = "anthropic"

    def __init__(self, fake: FakeAnthropic) -> None:
        self.fake = fake

    def script(self, *steps: FakeStep) -> None:
        self.fake.script(*steps)

    def model(self, *, retry: RetryPolicy | None = None) -> Model:
        # No keep-alive: nothing stays open after a test, so no client needs closing.
        client = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
        return AnthropicModel(MODEL, api_key=API_KEY, base_url=self.fake.url, retry=retry,
                              http_client=client)

    @property
    def base_url(self) -> str:
        return self.fake.url

    def cache_layout(self, index: int) -> CacheLayout:
        body = self.sent()[index]
        ends = [body[k][-1] for k in ("system", "tools") if body.get(k)]
        marked = [i for i, m in enumerate(body["messages"])
                  if any("cache_control" in b for b in m["content"])]
        assert len(marked) <= 1, f"more than one message marker: {marked}"
        return CacheLayout(
            prefix_marked=bool(ends) and all("cache_control" in b for b in ends),
            message_marker_after=marked[0] if marked else None,
            key=None,
        )

    def _messages(self, index: int) -> tuple[str, int, list[tuple[int, int]]]:
        s = self.sent_raw()[index].decode()
        start, _ = members(s, 0)["messages"]
        return s, start, items(s, start)

    def prefix_bytes(self, index: int, stable_messages: int) -> bytes:
        s, start, messages = self._messages(index)
        end = messages[stable_messages - 1][1] if stable_messages else start + 1
        return (s[:start] + s[start:end].replace(MESSAGE_MARKER, "")).encode()

    def replayed_opaque(self, index: int) -> list[str]:
        s, _, messages = self._messages(index)
        out = []
        for m_start, _ in messages:
            content_start, _ = members(s, m_start)["content"]
            for b_start, b_end in items(s, content_start):
                text = s[b_start:b_end]
                if json.loads(text)["type"] not in _PORT_BLOCKS:
                    out.append(text)
        return out

    def images(self, index: int) -> list[tuple[str, bytes]]:
        return [
            (b["source"]["media_type"], base64.b64decode(b["source"]["data"]))
            for m in self.sent()[index]["messages"]
            for b in m["content"]
            if b["type"] == "image"
        ]


@contextmanager
def make_backend() -> Iterator[AnthropicBackend]:
    with FakeAnthropic() as fake:
        yield AnthropicBackend(fake)
