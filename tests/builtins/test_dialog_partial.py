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
