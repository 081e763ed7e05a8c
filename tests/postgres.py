"""A throwaway PostgreSQL cluster for tests and benchmarks: real server, no mocks.

One cluster per run (initdb + start: ~0.6 s); each test gets its own database (~10 ms).
Durability is switched off (fsync, synchronous_commit, full_page_writes) because the cluster
is deleted afterwards anyway, and the cluster lives in /dev/shm when that has room: CREATE
DATABASE makes ~300 files, and on ext4 creating files next to many recently deleted ones is
slow (measured ~60 ms a database on disk against ~10 ms on tmpfs).

A missing server is an error, never a skip: the PostgreSQL store's tests must run wherever
the suite runs (.ci/run installs it).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

DEBIAN_BIN = Path("/usr/lib/postgresql")
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}
SHM = Path("/dev/shm")


def find_bin(name: str) -> Path:
    """Path of a PostgreSQL server binary: Debian keeps them off PATH, per major version."""
    majors = sorted(
        (p for p in DEBIAN_BIN.glob("*/bin") if p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    for d in majors:
        if (d / name).is_file():
            return d / name
    found = shutil.which(name)
    if found:
        return Path(found)
    raise RuntimeError(
        f"PostgreSQL server binaries not found ({name}); install Debian's `postgresql` "
        "package (apt-get install postgresql)"
    )


def _temp_base() -> Path | None:
    """/dev/shm when it is a tmpfs with room (Docker's default is 64 MB), else the temp dir."""
    try:
        return SHM if shutil.disk_usage(SHM).free >= 1 << 30 else None
    except OSError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A private PostgreSQL server in a temp dir, on a Unix socket and 127.0.0.1.

    As root the server runs as the `postgres` OS user (initdb and postgres refuse root);
    otherwise as the current user.
    """

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.port = 0
        self._names = itertools.count(1)
        self._conn: psycopg.Connection | None = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def data(self) -> Path:
        assert self.dir is not None, "cluster not started"
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.dir is not None, "cluster not started"
        return self.dir / "sock"

    def _run(self, *args: str | Path) -> None:
        cmd = [str(a) for a in args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # cwd: the server user may not be able to enter ours (e.g. /root)
        done = subprocess.run(cmd, cwd=self.dir, capture_output=True, text=True)
        if done.returncode != 0:
            log = self.dir / "log" if self.dir else None
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}{tail}"
            )

    def start(self) -> Cluster:
        """initdb, then start the server and wait until it accepts connections (pg_ctl -w)."""
        if self.dir is not None:
            return self
        pg_ctl = find_bin("pg_ctl")
        initdb = find_bin("initdb")
        self.dir = Path(tempfile.mkdtemp(prefix="pg-", dir=_temp_base()))
        atexit.register(self.stop)
        try:
            self.socket_dir.mkdir()
            if os.geteuid() == 0:
                try:
                    for p in (self.dir, self.socket_dir):
                        shutil.chown(p, "postgres", "postgres")
                except LookupError:
                    raise RuntimeError(
                        "running as root needs the `postgres` OS user to run the server as; "
                        "install Debian's `postgresql` package (apt-get install postgresql)"
                    ) from None
            self._run(
                initdb, "-D", self.data, "--auth=trust", "--username=postgres",
                "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions",
            )  # fmt: skip
            self.port = _free_port()
            settings = {
                **SETTINGS,
                "port": str(self.port),
                "unix_socket_directories": f"'{self.socket_dir}'",
            }
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
            self._run(pg_ctl, "start", "-w", "-t", "30", "-D", self.data, "-l", self.dir / "log")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Immediate shutdown and delete everything; safe to call twice or after a failed start."""
        if self.dir is None:
            return
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(find_bin("pg_ctl"), "stop", "-m", "immediate", "-w", "-D", self.data)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
            atexit.unregister(self.stop)

    def url_for(self, dbname: str) -> str:
        """libpq URL of a database over the Unix socket (the socket path percent-encoded)."""
        return (
            f"postgresql://postgres@/{quote(dbname, safe='')}"
            f"?host={quote(str(self.socket_dir), safe='')}&port={self.port}"
        )

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    @property
    def tcp_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _admin(self) -> psycopg.Connection:
        """One kept admin connection (a new one costs ~5 ms), reopened once it is closed."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True)
        return self._conn

    def create_database(self, name: str | None = None) -> str:
        """A fresh empty database (from template0); returns its URL.

        STRATEGY FILE_COPY (named since 15, the only way before) takes ~5 ms against ~10 ms for
        15's default WAL_LOG, which writes the whole template through the WAL; the checkpoints
        FILE_COPY takes are cheap with fsync off.
        """
        name = name or f"test_{next(self._names)}"
        create = sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name))
        if self._admin().info.server_version >= 150000:
            create += sql.SQL(" STRATEGY FILE_COPY")
        self._admin().execute(create)
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, terminating whatever is still connected to it."""
        self._admin().execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def kill_connections(self, dbname: str, timeout: float = 5.0) -> int:
        """Terminate every other backend connected to `dbname` (to test reconnects).

        Only client connections count (not, say, an autovacuum worker). Returns how many; by
        then they have exited. (pg_terminate_backend's own wait polls
        every 100 ms; pg_stat_activity shows them gone within a millisecond or so.)
        """
        others = (
            "SELECT pid FROM pg_stat_activity WHERE datname = %s"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        pids = [pid for (pid,) in self._admin().execute(others, (dbname,))]
        self._admin().execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (pids,)
        )
        deadline = time.monotonic() + timeout
        alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
        while self._admin().execute(alive, (pids,)).fetchone()[0]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"backends of {dbname} still alive after {timeout} s")
            time.sleep(0.001)  # a poll interval, not a guess: the loop checks the condition
        return len(pids)
