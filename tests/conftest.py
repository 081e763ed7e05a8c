"""Shared fixtures: anyio runs async tests on asyncio."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
