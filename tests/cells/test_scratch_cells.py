"""A builtin's scratch cell (``node.scratch``): its writes last only for the transaction
that makes them. They are read back inside it, then dropped at commit: no store write, no
new version, no change heard, nothing another transaction sees."""

from __future__ import annotations

import anyio
import pytest

from runtime import Runtime, cell, pattern
from runtime.cells.builtin import BuiltinNode
from runtime.errors import CellError
from runtime.storage import MemoryStore

NODES: list[tuple[BuiltinNode, object, object]] = []


def scratchpad(source):
    node = BuiltinNode("scratchpad", [source], name="pad")
    pad = node.scratch("answers", {})
    log = node.state("log", [])
    NODES.append((node, pad, log))
    return pad, log


@pattern(name="scratch-user")
def user():
    items = cell([], name="items")
    pad, log = scratchpad(items)
    return {"items": items, "pad": pad, "log": log}


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[list[str]] = []

    def commit(self, writes):
        self.written.append([w.key.id for w in writes])
        return super().commit(writes)


def test_scratch_writes_are_read_in_their_transaction_and_never_committed() -> None:
    store = CountingStore()

    async def main() -> None:
        async with Runtime(store=store) as rt:
            NODES.clear()
            rt.run(user)
            _, pad, log = NODES[-1]
            changes: list = []
            rt.on_commit(changes.append)
            store.written.clear()
            with rt.transaction():
                pad.key("c1").set("added a")
                assert pad.get() == {"c1": "added a"}  # seen inside
                log.push(pad.key("c1").get())
            assert store.written == [[log.doc_key.id]]  # the scratch cell was not written
            assert [c.id for batch in changes for c in batch] == [log.doc_key.id]
            assert pad.get() == {} and log.get() == ["added a"]
            assert store.load(pad.doc_key) is None  # never stored
            with rt.transaction():  # a transaction of scratch writes alone stores nothing
                pad.set({"c2": "x"})
            assert len(store.written) == 1 and pad.get() == {}
            pad.set({"c3": "y"})  # outside a transaction: its own, committed as nothing
            assert pad.get() == {} and len(store.written) == 1

    anyio.run(main)


def test_a_transaction_that_fails_leaves_nothing_and_the_next_starts_clean() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            NODES.clear()
            rt.run(user)
            _, pad, _ = NODES[-1]
            with pytest.raises(RuntimeError), rt.transaction():
                pad.key("c1").set("half")
                raise RuntimeError("the step failed")
            with rt.transaction():
                assert pad.get() == {}
                pad.key("c2").set("next")
                assert pad.get() == {"c2": "next"}

    anyio.run(main)


def test_a_key_is_stored_or_scratch_never_both() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            NODES.clear()
            rt.run(user)
            _, pad, log = NODES[-1]
            with pytest.raises(CellError, match="scratch and cannot be declared as stored"):
                rt.docs.declare(pad.doc_key, {})
            with pytest.raises(CellError, match="stored and cannot be made scratch"):
                rt.docs.scratch(log.doc_key, [])
            assert rt.docs.scratch(pad.doc_key, {}) is rt.docs.doc(pad.doc_key)  # once

    anyio.run(main)


def test_nodes_of_one_kind_share_it_and_each_transaction_sees_only_its_own_writes() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            NODES.clear()
            rt.run(user, session="one")
            rt.run(user, session="two")
            (_, pad_a, _), (_, pad_b, _) = NODES[-2:]
            assert pad_a.doc_key == pad_b.doc_key  # one document for every such node
            first, second = rt.begin(), rt.begin()
            with first.bound():
                pad_a.key("c1").set("from the first")
            with second.bound():
                assert pad_b.get() == {}  # the first's write is its own
                pad_b.key("c1").set("from the second")
            with first.bound():
                assert pad_a.get() == {"c1": "from the first"}
            first.commit()
            with second.bound():
                assert pad_b.get() == {"c1": "from the second"}  # no conflict either
            second.commit()
            assert pad_a.get() == {} == pad_b.get()

    anyio.run(main)
