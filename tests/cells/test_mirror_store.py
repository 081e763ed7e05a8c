"""``Runtime(store="memory")`` keeps each value once: its store (``MirrorStore``) holds
versions, and reads hand out copies of the runtime's committed values. Versions are still
checked, so stale and duplicate writes conflict exactly as on a ``MemoryStore``."""

from __future__ import annotations

import anyio
import pytest

from runtime import Runtime, cell, pattern
from runtime.storage import ConflictError, DocKey, MemoryStore, Write
from runtime.storage.mirror import MirrorStore


@pattern(name="mirror-list")
def listing():
    return {"items": cell([], name="items"), "n": cell(0, name="n")}


def test_the_private_store_keeps_versions_and_reads_the_runtimes_values() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            assert isinstance(rt.store, MirrorStore)
            items = rt.run(listing).result.key("items").resolve()
            items.push({"title": "a"})
            items.push({"title": "b"})
            key = items._key
            stored = rt.store.load(key)
            assert stored is not None and stored.value == [{"title": "a"}, {"title": "b"}]
            assert stored.version == rt.docs.doc(key).version
            assert rt.store._docs == {}  # no second copy of any value
            stored.value[0]["title"] = "changed by a reader"  # a copy: the runtime's stays
            assert items.get() == [{"title": "a"}, {"title": "b"}]
            assert key in list(rt.store.keys(key.space))
            assert rt.store.versions([key]) == {key: stored.version}
            assert rt.store.load_many([key])[key].value == items.get()

    anyio.run(main)


def test_versions_are_checked_as_on_a_memory_store() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            n = rt.run(listing).result.key("n").resolve()
            key, version = n._key, rt.docs.doc(n._key).version
            with pytest.raises(ConflictError, match="already exists"):
                rt.store.commit([Write(key, 1, 0)])  # create-if-absent: it exists
            with pytest.raises(ConflictError, match="expected"):
                rt.store.commit([Write(key, None, version - 1, (((), 1),))])  # stale
            other = DocKey("default", "", "never-made")
            with pytest.raises(ConflictError):  # all or nothing: the first write is undone
                rt.store.commit([Write(other, 1, 0), Write(key, None, version + 5, ((), 2))])
            assert rt.store.load(other) is None and rt.store.versions([key]) == {key: version}
            n.set(3)  # and the runtime's own commits go on from the version it holds
            assert rt.store.load(key).value == 3

    anyio.run(main)


def test_a_stored_document_later_computed_keeps_its_stored_value() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            key = DocKey("default", "", "was-stored")
            rt.docs.declare(key, {"kept": True})
            rt.docs.derive(key, lambda: {"computed": True})
            assert rt.store.load(key).value == {"kept": True}
            rt.docs.forget(key)
            assert rt.store.load(key).value == {"kept": True}

    anyio.run(main)


def test_a_store_passed_in_keeps_its_own_values() -> None:
    store = MemoryStore()

    async def main() -> None:
        async with Runtime(store=store, follow=False) as rt:
            assert rt.store is store and not isinstance(store, MirrorStore)
            n = rt.run(listing).result.key("n").resolve()
            n.set(7)
            assert store._docs[n._key].value == 7

    anyio.run(main)


def test_used_before_attach_says_so() -> None:
    store = MirrorStore()
    store.commit([Write(DocKey("default", "", "x"), 1, 0)])
    with pytest.raises(RuntimeError, match="attach"):
        store.load(DocKey("default", "", "x"))


def test_a_document_declared_then_computed_in_one_block_keeps_its_value() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            key = DocKey("default", "", "declared-then-derived")
            with rt.docs.declaring():  # its version comes at the block's end
                rt.docs.declare(key, {"kept": True})
                rt.docs.derive(key, lambda: {"computed": True})
            assert rt.store.load(key).value == {"kept": True}

    anyio.run(main)


def test_a_private_store_is_not_taken_over_by_another_runtime() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt1:
            n = rt1.run(listing).result.key("n").resolve()
            n.set(4)
            with pytest.raises(RuntimeError, match="already has its writer"):
                rt1.store.attach(lambda key: None)
            async with Runtime(store=rt1.store, follow=False) as rt2:
                assert rt2.docs.sole_writer is False
                assert rt1.store.load(n._key).value == 4  # still read from rt1

    anyio.run(main)
