"""A dialog for the lease tests, importable by a test and by the processes it starts (the
same pattern names the same documents in both)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio

from runtime import Runtime, cell, current_runtime, handler, llm_dialog, pattern
from runtime.llm import Reply, Request, ScriptedModel, StreamEvent, TextDelta, call


@handler
def block(event, log):
    """A tool that never returns (a process stuck in a long call): it says so, then blocks
    this whole process until it is killed."""
    rt = current_runtime()
    print(json.dumps({"blocked": rt.lease.holder}), flush=True)
    time.sleep(600)


@pattern(name="lease-agent")
def lease_agent():
    log = cell([], name="log")
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages, tools={
        "block": {"description": "Block", "handler": block(log=log)}})
    return {"messages": messages, "send": chat.add_message, "cancel": chat.cancel_generation,
            "pending": chat.pending, "partial": chat.partial,
            "error": chat.error, "dropped": chat.dropped}


class StdinGate:
    """A model that answers once a line arrives on stdin (a reply the test releases)."""

    provider = "scripted"
    name = "stdin-gate"

    def __init__(self, text: str) -> None:
        self.inner = ScriptedModel([text])

    async def generate(self, request: Request) -> Any:  # pragma: no cover - streams only
        raise NotImplementedError

    async def stream(self, request: Request):  # -> AsyncIterator[StreamEvent]
        print(json.dumps({"waiting": True}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        event: StreamEvent
        async for event in self.inner.stream(request):
            yield event


class Forever:
    """A model that streams a few words, then nothing more until it is cancelled (a long
    reply); it says when it starts waiting and when it is cancelled."""

    provider = "scripted"
    name = "forever"

    async def generate(self, request: Request) -> Any:  # pragma: no cover - streams only
        raise NotImplementedError

    async def stream(self, request: Request):  # -> AsyncIterator[StreamEvent]
        yield TextDelta(index=0, text="thinking about it")
        print(json.dumps({"waiting": True}), flush=True)
        try:
            await anyio.sleep_forever()
        finally:
            print(json.dumps({"cancelled": time.time()}), flush=True)
        yield TextDelta(index=0, text="never")  # pragma: no cover - never reached


async def _main(store: str, mode: str, ttl: float) -> None:
    if mode == "forever":
        model: Any = Forever()
    elif mode == "block":  # a step whose first call is answered in memory, the second blocks
        model = ScriptedModel([Reply(tool_calls=[call("read", {"path": "/nothing"}),
                                                      call("block", {})])])
    else:  # a reply held until the test writes a line
        model = StdinGate("late from A")
    async with Runtime(store=store, model=model, lease_ttl=ttl) as rt:
        inst = rt.run(lease_agent, user="u", session="s")
        print(json.dumps({"holder": rt.lease.holder}), flush=True)
        await inst.send("send", "one")
        await rt.settled()
        print(json.dumps({"done": inst.result.key("pending").get()}), flush=True)


def main(store: str, mode: str, ttl: str) -> None:
    anyio.run(_main, store, mode, float(ttl))
