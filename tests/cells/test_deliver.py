"""``rt.deliver``: a handler run inside the caller's open transaction. Its event is the
checked copy made for it: the handler may change it, and the sender's value stays as sent."""

from __future__ import annotations

import anyio
import pytest

from runtime import Runtime, cell, handler, pattern
from runtime.errors import UsageError


@handler
def note(event, log):
    event["seen"] = True  # a handler may treat its event as its own
    event["tags"].append("handled")
    log.push(event)


@pattern(name="deliver-log")
def logger():
    log = cell([], name="log")
    return {"log": log, "note": note(log=log)}


def test_the_handler_gets_its_own_copy_and_its_writes_join_the_transaction() -> None:
    async def main() -> None:
        async with Runtime(store="memory") as rt:
            inst = rt.run(logger)
            sent = {"text": "hi", "tags": ["a"]}
            with rt.transaction():
                rt.deliver(inst.stream("note"), sent)
                rt.deliver(inst.stream("note"), sent)  # the same value twice: two copies
            assert sent == {"text": "hi", "tags": ["a"]}  # the sender's value, untouched
            entry = {"text": "hi", "tags": ["a", "handled"], "seen": True}
            assert inst.result.key("log").get() == [entry, entry]
            with pytest.raises(UsageError, match="inside an open transaction"):
                rt.deliver(inst.stream("note"), sent)

    anyio.run(main)
