"""Writes that leave a document as committed (set, then set back, in one transaction)
write nothing: no store write, no new version, no change heard. The document still counts
as read: another writer's commit to it in between is a conflict."""

from __future__ import annotations

import anyio
import pytest

from runtime import Runtime, cell, pattern
from runtime.errors import ConflictError
from runtime.storage import MemoryStore


@pattern(name="scratch")
def scratch():
    return {"out": cell({}, name="out"), "log": cell([], name="log")}


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.written: list = []

    def commit(self, writes):
        self.written.append([w.key.id for w in writes])
        return super().commit(writes)


def test_a_write_set_back_in_one_transaction_writes_nothing() -> None:
    store = CountingStore()

    async def main() -> None:
        async with Runtime(store=store) as rt:
            res = rt.run(scratch).result
            out, log = res.key("out").resolve(), res.key("log").resolve()
            changes: list = []
            rt.on_commit(changes.append)
            store.written.clear()
            with rt.transaction():
                out.key("c1").set("answer")
                assert out.get() == {"c1": "answer"}  # the transaction sees its write
                log.push("step")
                out.set({})  # cleared again: as committed
            assert store.written == [[log.doc_key.id]]  # only the log was written
            assert [(c.id, c.path) for batch in changes for c in batch] == [(log.doc_key.id, "/0")]
            assert out.get() == {} and log.get() == ["step"]
            with rt.transaction():
                out.key("c1").set("kept")  # not set back: written
            assert out.get() == {"c1": "kept"} and len(store.written) == 2

    anyio.run(main)


def test_a_set_back_document_still_conflicts_with_another_writer() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            out = rt.run(scratch).result.key("out").resolve()
            wrote, theirs = anyio.Event(), anyio.Event()

            async def other() -> None:
                await wrote.wait()
                out.set({"theirs": True})  # another task commits in between
                theirs.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                with pytest.raises(ConflictError), rt.transaction():
                    out.key("x").set(1)
                    wrote.set()
                    await theirs.wait()
                    out.set({})
            assert out.get() == {"theirs": True}

    anyio.run(main)


def test_a_transaction_whose_writes_all_cancel_out_touches_no_store() -> None:
    store = CountingStore()

    async def main() -> None:
        async with Runtime(store=store) as rt:
            out = rt.run(scratch).result.key("out").resolve()
            store.written.clear()
            with rt.transaction():
                out.key("c1").set("answer")
                out.set({})
            assert store.written == [] and out.get() == {}

    anyio.run(main)
