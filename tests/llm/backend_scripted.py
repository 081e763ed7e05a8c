"""The contract suite's scripted backend: ``ScriptedModel`` behind the ``harness.Backend`` API.

The shared script steps map onto scripted steps: a ``Response`` is the reply itself, an HTTP
error becomes the ``LLMError`` an adapter would raise for it, and the broken-stream steps become
a streamed step that yields the reply's first events and then fails (or hangs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runtime.llm import (
    Fault,
    ImageBlock,
    LLMError,
    Model,
    OpaqueBlock,
    Response,
    RetryPolicy,
    retry_class,
)
from runtime.llm.events import response_events
from runtime.llm.retrying_model import with_retry
from runtime.llm.scripted import Pause, ScriptedModel
from runtime.llm.scripted import Step as ScriptedStep

from .harness import CacheLayout
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent, Step

PROVIDER = "scripted"
HANG_SECONDS = 3600.0


def _transient(message: str) -> LLMError:
    return LLMError(message, fault=Fault.TRANSIENT, provider=PROVIDER)


def to_scripted(step: Step) -> ScriptedStep:
    """The scripted step closest to what the loopback fakes do for ``step``."""
    match step:
        case Response():
            return step
        case HTTPError(status=status, kind=kind, retry_after=retry_after, message=message):
            return LLMError(
                message,
                fault=retry_class(status, kind == "quota"),
                provider=PROVIDER,
                status=status,
                retry_after=retry_after,
            )
        case DropMidStream(response=r, after_events=n):
            return [*response_events(r)[:n], _transient("connection dropped mid-stream")]
        case MalformedEvent(response=r, after_events=n):
            bad = LLMError("malformed response: an event is not JSON", fault=Fault.TERMINAL,
                           provider=PROVIDER)
            return [*response_events(r)[:n], bad]
        case Hang(response=r, after_events=n):
            return [*response_events(r)[:n], Pause(HANG_SECONDS), _transient("hang ended")]
    raise TypeError(f"unknown script step {step!r}")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class ScriptedBackend:
    name = PROVIDER

    def __init__(self) -> None:
        self.scripted = ScriptedModel(name="scripted-model", provider=PROVIDER)

    def script(self, *steps: Step) -> None:
        self.scripted.add(*(to_scripted(s) for s in steps))

    def model(self, *, retry: RetryPolicy | None = None) -> Model:
        return with_retry(self.scripted, retry)

    def sent(self) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") for r in self.scripted.requests]

    def sent_raw(self) -> list[bytes]:
        return [r.model_dump_json().encode() for r in self.scripted.requests]

    def cache_layout(self, index: int) -> CacheLayout:
        hint = self.scripted.requests[index].cache
        return CacheLayout(
            prefix_marked=hint.prefix,
            message_marker_after=hint.stable_messages - 1 if hint.stable_messages else None,
            key=hint.key or None,
        )

    def prefix_bytes(self, index: int, stable_messages: int) -> bytes:
        body = self.sent()[index]
        return _canonical(
            {
                "system": body["system"],
                "tools": body["tools"],
                "messages": body["messages"][:stable_messages],
            }
        )

    def replayed_opaque(self, index: int) -> list[str]:
        return [
            b.raw
            for m in self.scripted.requests[index].messages
            for b in m.blocks
            if isinstance(b, OpaqueBlock)
        ]

    def images(self, index: int) -> list[tuple[str, bytes]]:
        return [
            (b.media_type, b.data)
            for m in self.scripted.requests[index].messages
            for b in m.blocks
            if isinstance(b, ImageBlock)
        ]


@contextmanager
def make_backend() -> Iterator[ScriptedBackend]:
    yield ScriptedBackend()
