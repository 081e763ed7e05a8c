"""What every backend of the contract suite provides (``tests/llm/backend_<name>.py``).

Each such module defines ``make_backend()`` returning a context manager that yields an object
satisfying ``Backend``. The contract suite (``test_contract.py``) is written once against this
protocol and parametrised over ``BACKENDS``, so the scripted model and both adapters are held
to the same behaviour.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.llm import Model, RetryPolicy

from .steps import Step

BACKENDS = ["scripted", "anthropic", "openai", "openai_responses", "azure", "gemini"]


@dataclass(frozen=True)
class CacheLayout:
    """Where a request's cache hint landed, normalised across providers."""

    prefix_marked: bool  # system prompt + tools marked as one cacheable prefix
    message_marker_after: int | None  # index of the message carrying a marker, or None
    key: str | None  # the routing key sent (OpenAI ``prompt_cache_key``), or None


class Backend(Protocol):
    name: str

    def script(self, *steps: Step) -> None:
        """Queue the replies for the next model calls, in order (appends to the queue)."""

    def model(self, *, retry: RetryPolicy | None = None) -> Model:
        """A model talking to this backend. ``retry`` replaces the default policy (tests pass
        one with a recording ``sleep`` so no test really waits)."""

    def sent(self) -> list[dict[str, Any]]:
        """Request bodies received so far, as JSON (wire format; scripted: Request dumps)."""

    def sent_raw(self) -> list[bytes]:
        """The same requests as the exact bytes received."""

    def cache_layout(self, index: int) -> CacheLayout:
        """Normalised cache placement of request ``index``."""

    def prefix_bytes(self, index: int, stable_messages: int) -> bytes:
        """The exact bytes of request ``index`` that encode system prompt, tools and the
        first ``stable_messages`` messages (the part a prompt cache reuses)."""

    def replayed_opaque(self, index: int) -> list[str]:
        """Raw JSON text of every opaque (provider-verbatim) block in request ``index``,
        exactly as it appears in the bytes sent."""

    def images(self, index: int) -> list[tuple[str, bytes]]:
        """(media type, decoded bytes) of every image in request ``index``."""


class AdapterBackend(Backend, Protocol):
    """A provider adapter's backend: a loopback fake server speaking the provider's wire."""

    @property
    def base_url(self) -> str:
        """The base URL that points an adapter at the fake."""

    def client_ports(self) -> list[int]:
        """The client-side port of each request's TCP connection, as the fake saw it (equal
        ports: one reused connection)."""

    def closed_by_client(self, index: int, timeout: float) -> bool:
        """Whether the client closed request ``index``'s connection within ``timeout``
        seconds (blocking: call it from a worker thread)."""


class FakeServerRecords:
    """What both adapter backends answer the same way from their fake's recorded exchanges."""

    fake: Any

    def client_ports(self) -> list[int]:
        return [ex.handler.client_address[1] for ex in self.fake.exchanges]

    def closed_by_client(self, index: int, timeout: float) -> bool:
        return self.fake.exchanges[index].closed_by_client.wait(timeout)

    def sent(self) -> list[dict[str, Any]]:
        return [r.body for r in self.fake.requests]

    def sent_raw(self) -> list[bytes]:
        return [r.raw for r in self.fake.requests]


# -- retry policies that never wait (every module of the suite uses them) ----------------


class Sleeps:
    """A ``RetryPolicy.sleep`` that records the waits instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def policy(sleeps: Sleeps, attempts: int = 3) -> RetryPolicy:
    return RetryPolicy(max_attempts=attempts, sleep=sleeps, clock=lambda: 0.0)


def load(name: str) -> AbstractContextManager[Backend]:
    import importlib

    return importlib.import_module(f"tests.llm.backend_{name}").make_backend()
