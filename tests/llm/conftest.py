"""Fixtures for the LLM port's tests.

``backend`` runs a test once per entry of ``harness.BACKENDS``. A backend whose module is
missing errors (ModuleNotFoundError) instead of being skipped: a contract nobody checked is
not a pass.

Adapters made without an ``http_client`` own a pooled client that a careful caller closes
with ``aclose()``. Most tests do not bother, so every async test closes, at its end and in
its own event loop, each owned client its adapters opened: no test leaves a socket open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from runtime.llm.providers._http import ClientSlot

from . import harness


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=harness.BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[harness.Backend]:
    with harness.load(request.param) as b:
        yield b


@pytest.fixture
async def _close_owned_clients(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    slots: list[ClientSlot] = []
    init = ClientSlot.__init__

    def recording_init(self: ClientSlot, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        slots.append(self)

    monkeypatch.setattr(ClientSlot, "__init__", recording_init)
    yield
    for slot in slots:
        await slot.aclose()


@pytest.fixture(autouse=True)
def _owned_clients_closed(request: pytest.FixtureRequest) -> None:
    if "anyio_backend" in request.fixturenames:  # an async test: it has an event loop
        request.getfixturevalue("_close_owned_clients")
