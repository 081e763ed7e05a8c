"""Fixtures for the LLM port's tests.

``backend`` runs a test once per entry of ``harness.BACKENDS``. A backend whose module is
missing errors (ModuleNotFoundError) instead of being skipped: a contract nobody checked is
not a pass.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import harness


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=harness.BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[harness.Backend]:
    with harness.load(request.param) as b:
        yield b
