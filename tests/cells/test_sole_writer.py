"""A runtime on its own ``"memory"`` store is the store's only writer: rereading a
document from the store (``Cell.refresh``, the dialog's turn checks) reads nothing. On a
store object others may share, it reads, and sees their commits."""

from __future__ import annotations

import anyio

from runtime import Runtime, cell, pattern
from runtime.storage import MemoryStore


@pattern(name="sole-counter")
def counter():
    return {"n": cell(0, name="n")}


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def load(self, key):
        self.loads += 1
        return super().load(key)


def test_a_private_store_is_not_read_again() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            assert rt.docs.sole_writer
            n = rt.run(counter).result.key("n").resolve()
            loads = []
            real = rt.store.load
            rt.store.load = lambda key: (loads.append(key), real(key))[1]  # type: ignore
            n.refresh()
            assert loads == []

    anyio.run(main)


def test_a_shared_store_is_read_again_and_sees_the_other_writer() -> None:
    store = CountingStore()

    async def main() -> None:
        async with Runtime(store=store, follow=False) as a, \
                Runtime(store=store, follow=False) as b:
            assert not a.docs.sole_writer
            na = a.run(counter).result.key("n").resolve()
            nb = b.run(counter).result.key("n").resolve()
            nb.set(5)
            assert na.get() == 0  # not followed: a's copy is behind
            before = store.loads
            na.refresh()
            assert store.loads > before and na.get() == 5

    anyio.run(main)
