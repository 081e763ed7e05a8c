"""The throwaway PostgreSQL the store's tests run against (tests/postgres.py) does what it says."""

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests import postgres
from tests.postgres import Cluster


def test_url_connects_over_the_unix_socket(pg_cluster: Cluster) -> None:
    with psycopg.connect(pg_cluster.url) as conn:
        version, addr = conn.execute("SELECT version(), inet_server_addr()").fetchone()
    assert version.startswith("PostgreSQL ")
    assert addr is None  # no server address: a Unix socket


def test_tcp_url_connects_over_loopback(pg_cluster: Cluster) -> None:
    with psycopg.connect(pg_cluster.tcp_url) as conn:
        (addr,) = conn.execute("SELECT inet_server_addr()::text").fetchone()
    assert addr == "127.0.0.1/32"


def test_durability_is_off(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        settings = [
            conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("fsync", "synchronous_commit", "full_page_writes")
        ]
    assert settings == ["off", "off", "off"]


def test_each_pg_url_is_its_own_empty_database(pg_url: str, pg_cluster: Cluster) -> None:
    other = pg_cluster.create_database()
    assert conninfo_to_dict(other)["dbname"] != conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE t (x int)")
    with psycopg.connect(other) as conn:
        (tables,) = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
    assert tables == 0
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('t')::text").fetchone() == ("t",)


def test_kill_connections_terminates_the_other_connections(
    pg_url: str, pg_cluster: Cluster
) -> None:
    dbname = conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_url) as victim:
        victim.execute("SELECT 1")
        assert pg_cluster.kill_connections(dbname) == 1
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        assert victim.closed
    with psycopg.connect(pg_url) as again:  # the database itself is fine: reconnecting works
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_stop_removes_the_server_and_its_files_and_is_idempotent() -> None:
    cluster = Cluster().start()
    url, root = cluster.url, cluster.dir
    assert root is not None and (root / "data" / "postmaster.pid").exists()
    cluster.stop()
    cluster.stop()
    assert not root.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)


def test_missing_server_binaries_fail_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(postgres, "DEBIAN_BIN", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"apt-get install postgresql"):
        postgres.find_bin("initdb")
