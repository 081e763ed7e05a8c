"""Shared fixtures: anyio runs async tests on asyncio; a throwaway PostgreSQL per run."""

from collections.abc import Iterator
from pathlib import Path
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


@pytest.fixture(params=["sqlite", "postgres"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """One database the processes of a test share: a SQLite file, or a fresh database of
    the run's throwaway PostgreSQL cluster (the same tests run on both)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'shared.db'}"
