"""Shared fixtures: anyio runs async tests on asyncio; a throwaway PostgreSQL per run."""

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.postgres import Cluster


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator["Cluster"]:
    """One PostgreSQL server for the whole run, started only if a test asks for it.

    Imported here, not at the top: psycopg costs every run ~0.1 s to import.
    """
    from tests.postgres import Cluster

    with Cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: "Cluster") -> Iterator[str]:
    """URL of a fresh empty database (~10 ms), dropped afterwards with its connections."""
    from psycopg.conninfo import conninfo_to_dict

    url = pg_cluster.create_database()
    yield url
    pg_cluster.drop_database(conninfo_to_dict(url)["dbname"])
