"""Several processes on one SQLite file, at the store level: the case versions exist for.

Threads would share one interpreter and could hide what only separate processes do (each
its own connection, cache and timing), so these are real processes (``multiprocessing``
with ``spawn``). Each trial starts four of them together on a fresh file: every one tries
to create the same document (``expect=0``: exactly one may win), then does read, increment,
commit-with-``expect`` cycles, retrying on ``ConflictError``. No increment may be lost, no
process may crash or see the database as busy. The increments are patches (a counter and a
log that grows by one item), so the patch log and each process's cached copy are checked
under contention too. Four processes are started once and run every trial (each behind a
barrier, on its own file) to keep the module fast; the open test starts new ones.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import traceback
from pathlib import Path
from typing import Any

from runtime.storage import ConflictError, DocKey, SQLiteStore, Stored, Write

PROCESSES = 4
TRIALS = 20
INCREMENTS = 25
JOIN_TIMEOUT = 120  # seconds; a hang fails the test instead of blocking the run
KEY = DocKey("shared", "", "counter")


def _counter_trials(wid: int, paths: list[str], barrier: Any, results: Any) -> None:
    try:
        for path in paths:
            barrier.wait()  # every process starts the trial, opening included, together
            store = SQLiteStore(path)
            try:
                created = conflicts = 0
                try:
                    store.commit([Write(KEY, {"n": 0, "log": []}, expect=0)])
                    created = 1
                except ConflictError:
                    pass
                done = 0
                while done < INCREMENTS:
                    got = store.load(KEY)
                    assert got is not None, "the document was created before this load"
                    n, log = got.value["n"], got.value["log"]
                    steps = ((("n",), n + 1), (("log", len(log)), wid))
                    try:
                        store.commit([Write(KEY, None, expect=got.version, patch=steps)])
                    except ConflictError:
                        conflicts += 1
                        continue
                    done += 1
            finally:
                store.close()
            results.put(("ok", wid, path, created, done, conflicts))
    except BaseException:
        results.put(("error", wid, traceback.format_exc()))


def _open_at_once(wid: int, path: str, barrier: Any, results: Any) -> None:
    try:
        barrier.wait()
        store = SQLiteStore(path)  # all four at the very same moment
        try:
            try:
                store.commit([Write(KEY, {"n": 0, "log": []}, expect=0)])
                created = 1
            except ConflictError:
                created = 0
            while True:
                got = store.load(KEY)
                assert got is not None
                steps = ((("log", len(got.value["log"])), wid),)
                try:
                    store.commit([Write(KEY, None, expect=got.version, patch=steps)])
                    break
                except ConflictError:
                    continue
        finally:
            store.close()
        results.put(("ok", wid, path, created, 1, 0))
    except BaseException:
        results.put(("error", wid, traceback.format_exc()))


def _run(target: Any, args_for: Any, expected_reports: int) -> list[tuple[Any, ...]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(wid, *args_for(wid), barrier, results))
        for wid in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    reports = []
    try:
        for _ in range(expected_reports):
            report = results.get(timeout=JOIN_TIMEOUT)
            assert report[0] == "ok", f"process {report[1]} failed:\n{report[2]}"
            reports.append(report)
    finally:
        for p in procs:
            p.join(timeout=JOIN_TIMEOUT)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return reports


def _check_trial(path: str, reports: list[tuple[Any, ...]], per_process: int) -> None:
    assert sum(r[3] for r in reports) == 1, f"{path}: exactly one process creates it"
    total = sum(r[4] for r in reports)
    assert total == PROCESSES * per_process
    store = SQLiteStore(path)
    try:
        got = store.load(KEY)
    finally:
        store.close()
    assert got is not None
    assert got.version == 1 + total  # the create, then one version per committed change
    log = got.value["log"]
    assert len(log) == total
    assert sorted(log) == sorted(w for w in range(PROCESSES) for _ in range(per_process))


def test_four_processes_increment_one_counter_without_losing_any(tmp_path: Path) -> None:
    paths = [str(tmp_path / f"trial-{t}.db") for t in range(TRIALS)]
    reports = _run(_counter_trials, lambda wid: (paths,), TRIALS * PROCESSES)
    for path in paths:
        mine = [r for r in reports if r[2] == path]
        assert len(mine) == PROCESSES
        _check_trial(path, mine, INCREMENTS)
        store = SQLiteStore(path)
        try:
            got = store.load(KEY)
            assert got is not None and got.value["n"] == PROCESSES * INCREMENTS
        finally:
            store.close()
    assert sum(r[5] for r in reports) > 0, "the processes never raced: the test proves nothing"


def test_four_new_processes_open_one_file_at_the_same_moment(tmp_path: Path) -> None:
    """New processes, a barrier just before opening: one fresh file, one from before the
    patch log (so the four race to migrate it too)."""
    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.execute(
        "CREATE TABLE docs (space TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL, "
        "value TEXT NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (space, scope, id)) "
        "WITHOUT ROWID"
    )
    db.execute("INSERT INTO docs VALUES (?,?,?,?,?)", (*KEY, '{"n":0,"log":[]}', 1))
    db.commit()
    db.close()
    fresh = str(tmp_path / "fresh.db")
    reports = _run(_open_at_once, lambda wid: (fresh,), PROCESSES)
    _check_trial(fresh, reports, 1)
    reports = _run(_open_at_once, lambda wid: (str(old),), PROCESSES)
    assert sum(r[3] for r in reports) == 0  # it existed already
    store = SQLiteStore(old)
    try:
        got = store.load(KEY)
        assert got is not None and got.version == 1 + PROCESSES
        assert sorted(got.value["log"]) == list(range(PROCESSES))
        assert store.load(DocKey("shared", "", "other")) is None
        assert store.commit([Write(KEY, "whole", expect=1 + PROCESSES)]) == {KEY: 2 + PROCESSES}
        assert store.load(KEY) == Stored("whole", 2 + PROCESSES)
    finally:
        store.close()
