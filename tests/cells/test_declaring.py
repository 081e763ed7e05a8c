"""``rt.run`` stores an instance's documents in one commit (``Documents.declaring``): one
round trip instead of one per document. Another process creating one of them first still
wins for that one; a store that fails leaves nothing behind that only this process
believes."""

from __future__ import annotations

import anyio
import pytest

from runtime import Runtime, cell, handler, pattern
from runtime.errors import StorageError
from runtime.storage import MemoryStore, Write


@handler
def add(event, items):
    items.push(event)


@pattern(name="declared")
def declared():
    items = cell([], name="items")
    note = cell("fresh", name="note")
    return {"items": items, "note": note, "add": add(items=items)}


class Recording(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.commits: list[list[Write]] = []
        self.before_next: list = []  # run before the next commit (another process's move)
        self.fail_next = False

    def commit(self, writes):
        self.commits.append(list(writes))
        while self.before_next:
            self.before_next.pop()()
        if self.fail_next:
            self.fail_next = False
            raise StorageError("the disk is full")
        return super().commit(writes)


def test_an_instance_is_declared_in_one_commit() -> None:
    store = Recording()

    async def main() -> None:
        async with Runtime(store=store, follow=False) as rt, \
                Runtime(store=store, follow=False) as later:
            store.commits.clear()
            inst = rt.run(declared, session="a")
            assert len(store.commits) == 1 and len(store.commits[0]) >= 4
            await inst.send("add", "milk")
            assert inst.result.key("items").get() == ["milk"]
            # another runtime on the store (a restart) finds them
            assert later.run(declared, session="a").result.key("items").get() == ["milk"]

    anyio.run(main)


def test_a_document_another_process_created_first_keeps_its_value() -> None:
    store = Recording()

    async def main() -> None:
        async with Runtime(store=store, follow=False) as other, \
                Runtime(store=store, follow=False) as rt:
            note = other.run(declared, session="b").result.key("note").resolve()
            key = note.doc_key

            def theirs() -> None:
                MemoryStore.commit(store, [Write(key, "theirs", 0)])

            # the other documents are there; "note" is created by the other process between
            # this runtime's read (nothing there) and its commit
            store._docs.pop(key)
            store.before_next.append(theirs)
            commits = len(store.commits)
            inst = rt.run(declared, session="b")
            assert len(store.commits) > commits + 1  # the batch, refused; then one by one
            assert inst.result.key("note").get() == "theirs"
            assert inst.result.key("items").get() == []
            await inst.send("add", "tea")
            assert inst.result.key("items").get() == ["tea"]

    anyio.run(main)


def test_a_failed_store_leaves_no_document_behind() -> None:
    store = Recording()

    async def main() -> None:
        async with Runtime(store=store) as rt:
            store.fail_next = True
            with pytest.raises(StorageError, match="disk is full"):
                rt.run(declared, session="c")
            assert rt.docs._docs.keys().isdisjoint(
                w.key for w in store.commits[-1])  # nothing only we believe in
            inst = rt.run(declared, session="c")  # the store works again: all of it
            await inst.send("add", "bread")
            assert inst.result.key("items").get() == ["bread"]

    anyio.run(main)
