"""Streamed text costs storage linear in the reply's length (defect 4 of issue 14): each
flush of ``partial`` appends what arrived since the last one, never the whole text again."""

from __future__ import annotations

import itertools

import pytest

from runtime import Runtime
from runtime.llm import ScriptedModel, Stop, StopReason, TextDelta

from .support import assert_valid_history, todo_agent

pytestmark = pytest.mark.anyio


async def test_each_flush_of_partial_writes_only_the_new_text():
    pieces = [f"word{i:04d} " for i in range(2000)]  # 20,000 characters
    events = [TextDelta(index=0, text=p) for p in pieces] + [Stop(stop_reason=StopReason.END_TURN)]
    ticks = itertools.count()  # every clock read a second later: every delta is flushed
    seen: list[str] = []
    written = [0]
    async with Runtime(model=ScriptedModel([events]),
                       clock=lambda: float(next(ticks))) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        partial = inst.result.key("partial")

        def measure(changes):
            for change in changes:  # everything the turn's commits wrote
                written[0] += len(str(change.after))
            value = partial.get()
            if value is not None:
                seen.append(value)

        rt.on_commit(measure)
        await inst.send("send", "talk")
        await rt.settled()
        reply = "".join(pieces)
        assert [m.text_content() for m in assert_valid_history(inst)] == ["talk", reply]
        assert partial.get() is None  # the turn ended: nothing streamed is left
    assert len(seen) > 1000 and all(reply.startswith(s) for s in seen)  # it streamed
    # linear: the turn's commits wrote about the reply twice (streamed, then stored in the
    # history), not everything so far again at each flush (that would be ~20 MB here)
    assert written[0] <= 4 * len(reply), written[0]


async def test_text_held_back_by_the_interval_is_written_when_the_model_pauses():
    """Deltas closer together than the flush interval, then a long pause (a model
    thinking mid-reply): all that was sent shows in ``partial`` during the pause."""
    import anyio

    from runtime.llm.scripted import Pause

    events = [TextDelta(index=0, text="Hel"), TextDelta(index=0, text="lo, "),
              TextDelta(index=0, text="Ada"), Pause(600), Stop(stop_reason=StopReason.END_TURN)]
    async with Runtime(model=ScriptedModel([events])) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        partial = inst.result.key("partial")
        whole = anyio.Event()
        partial.sink(lambda value: whole.set() if value == "Hello, Ada" else None)
        await inst.send("send", "talk")
        with anyio.fail_after(5):  # the interval is 0.25 s; the pause 600 s
            await whole.wait()
        assert inst.result.key("pending").get() is True
        await inst.send("cancel", None)
        await rt.settled()
        assert partial.get() is None and inst.result.key("pending").get() is False


async def test_text_held_back_again_after_a_trailing_flush_is_written_too():
    """The trailing flush is started when text is held back and ends once it has written
    it: text held back after that starts another, so each pause shows all sent so far."""
    import anyio

    from runtime.llm.scripted import Pause

    events = [TextDelta(index=0, text="A"), TextDelta(index=0, text="B"), Pause(0.6),
              TextDelta(index=0, text="C"), TextDelta(index=0, text="D"), Pause(600),
              Stop(stop_reason=StopReason.END_TURN)]
    async with Runtime(model=ScriptedModel([events])) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        partial = inst.result.key("partial")
        shown: list[str] = []
        whole = anyio.Event()

        def seen(value: str | None) -> None:
            if value is not None:
                shown.append(value)
            if value == "ABCD":
                whole.set()

        partial.sink(seen)
        await inst.send("send", "talk")
        with anyio.fail_after(10):  # the interval is 0.25 s; the second pause 600 s
            await whole.wait()
        assert "AB" in shown  # the first pause showed its head
        await inst.send("cancel", None)
        await rt.settled()
        assert partial.get() is None


async def test_a_turn_streaming_no_text_runs_no_task_beside_its_own():
    """While a step's model call is held, the turn is one task: nothing waits beside it for
    text that may never come (a task per turn was a twentieth of a step's work)."""
    import asyncio

    import anyio

    from runtime.llm import Reply, call

    from .support import Gate

    model = Gate([Reply(tool_calls=[call("addItem", {"title": "x"})]), "done"])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await rt.settled()
        before = set(asyncio.all_tasks())
        await inst.send("send", "talk")
        with anyio.fail_after(5):
            await model.started.wait()
        started = set(asyncio.all_tasks()) - before
        assert len(started) == 1, started  # the turn
        model.opened.set()
        await rt.settled()
        assert inst.result.key("pending").get() is False
        assert [m.text_content() for m in assert_valid_history(inst)][-1] == "done"
