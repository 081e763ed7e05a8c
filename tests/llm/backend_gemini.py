"""The Gemini adapter against ``FakeGemini``, as a contract-suite ``Backend``.

Request bytes are read by position (``jsonspans``), not re-serialised, so ``prefix_bytes``
and ``replayed_opaque`` report exactly what went over the wire. One port message is one
``Content`` (the adapter sends the system prompt as ``systemInstruction``, outside
``contents``).

Gemini opaque blocks are of two kinds (``providers/gemini.py``): a whole part (a thought),
which is a part on the wire verbatim, and a thought signature, which goes back as the
``thoughtSignature`` member of the part before it. ``replayed_opaque`` lists the first as
the part's bytes and the second as ``{`` + that member's bytes + ``}``, which is the
block's raw JSON when the signature went back unchanged. Google's placeholder signature,
which the adapter adds for a Gemini 3 model where a call has none, replays no block and is
not listed.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runtime.llm import RetryPolicy
from runtime.llm.providers.gemini import GeminiModel

from .fake_gemini import SKIP_SIGNATURE, FakeGemini, FakeStep
from .harness import CacheLayout, FakeServerRecords
from .jsonspans import Span, items, members, skip

API_KEY = "AIzaSyFake-gemini-key-0123456789abcdef"
MODEL = "gemini-2.5-flash"
_PORT_PARTS = ("functionCall", "functionResponse", "inlineData")


class GeminiBackend(FakeServerRecords):
    name = "gemini"

    def __init__(self, fake: FakeGemini) -> None:
        self.fake = fake

    def script(self, *steps: FakeStep) -> None:
        self.fake.script(*steps)

    def model(self, *, retry: RetryPolicy | None = None) -> GeminiModel:
        return GeminiModel(MODEL, api_key=API_KEY, base_url=self.fake.url, retry=retry)

    @property
    def base_url(self) -> str:
        return self.fake.url

    def cache_layout(self, index: int) -> CacheLayout:
        # Gemini caches prefixes by itself: nothing marks them, and there is no routing key
        # (``cachedContent`` would name an explicit cache, which the adapter never makes).
        body = self.sent()[index]
        return CacheLayout(prefix_marked=False, message_marker_after=None,
                           key=body.get("cachedContent"))

    def _contents(self, index: int) -> tuple[str, Span, list[Span]]:
        text = self.sent_raw()[index].decode()
        span = members(text, 0)["contents"]
        return text, span, items(text, span[0])

    def prefix_bytes(self, index: int, stable_messages: int) -> bytes:
        """Everything up to the end of the ``stable_messages``-th content. The adapter puts
        ``systemInstruction`` and ``tools`` before ``contents``, so this is a true prefix."""
        text, span, contents = self._contents(index)
        if stable_messages > len(contents):
            raise IndexError(f"request {index} has only {len(contents)} contents")
        end = contents[stable_messages - 1][1] if stable_messages else skip(text, span[0]) + 1
        return text[:end].encode()

    def _parts(self, index: int) -> Iterator[tuple[str, Span, dict[str, Span], dict[str, Any]]]:
        """(the request's text, the part's span, its members' spans, the part parsed) of
        every part of every content."""
        text, _, contents = self._contents(index)
        for start, _ in contents:
            for a, b in items(text, members(text, start)["parts"][0]):
                yield text, (a, b), members(text, a), json.loads(text[a:b])

    def replayed_opaque(self, index: int) -> list[str]:
        out = []
        for text, (a, b), spans, part in self._parts(index):
            plain = ("text" in part and not part.get("thought")) or any(
                k in part for k in _PORT_PARTS)
            if not plain:  # a thought, or a part the port does not model: spliced whole
                out.append(text[a:b])
            elif "thoughtSignature" in spans and part["thoughtSignature"] != SKIP_SIGNATURE:
                value_start, value_end = spans["thoughtSignature"]
                key = text.rindex('"thoughtSignature"', 0, value_start)
                out.append("{" + text[key:value_end] + "}")
        return out

    def images(self, index: int) -> list[tuple[str, bytes]]:
        return [(p["inlineData"]["mimeType"], base64.b64decode(p["inlineData"]["data"]))
                for _, _, _, p in self._parts(index) if "inlineData" in p]


@contextmanager
def make_backend() -> Iterator[GeminiBackend]:
    with FakeGemini() as fake:
        yield GeminiBackend(fake)
