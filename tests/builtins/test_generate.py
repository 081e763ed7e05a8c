"""generate_text / generate_object through the real runtime, against ScriptedModel and held
models: results, partial text, memoisation (also across a restart), empty prompts, errors,
supersession, JSON and presentResult objects."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from runtime import PatternError, Runtime, SchemaError, cell, handler, pattern
from runtime.builtins.generate import generate_object, generate_text
from runtime.llm import (
    Message,
    Reply,
    Request,
    ScriptedModel,
    Stop,
    StopReason,
    StreamEvent,
    TextDelta,
    call,
)

pytestmark = pytest.mark.anyio


def _last_user_text(request: Request) -> str:
    return request.messages[-1].text_content()


class Held:
    """A model that answers ``re: <prompt>``, each call held until the test opens the gate
    of its prompt. ``shield=True`` holds it where cancellation cannot reach (a reply that
    slips past the cancel of its generation)."""

    provider = "scripted"
    name = "held"

    def __init__(self, *, shield: bool = False) -> None:
        self.shield = shield
        self.calls: list[str] = []
        self.finished: list[str] = []
        self.gates: dict[str, anyio.Event] = {}
        self._changed = anyio.Event()

    def gate(self, prompt: str) -> anyio.Event:
        return self.gates.setdefault(prompt, anyio.Event())

    async def calls_reach(self, n: int) -> None:
        with anyio.fail_after(10):
            while len(self.calls) < n:
                await self._changed.wait()

    async def generate(self, request: Request) -> Any:  # pragma: no cover - streams only
        raise NotImplementedError

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        prompt = _last_user_text(request)
        self.calls.append(prompt)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        with anyio.CancelScope(shield=self.shield):
            await self.gate(prompt).wait()
        async for event in ScriptedModel([f"re: {prompt}"]).stream(request):
            yield event
        self.finished.append(prompt)


class Streaming:
    """A model that streams "Hel", holds until ``opened``, then streams "lo"."""

    provider = "scripted"
    name = "streaming"

    def __init__(self) -> None:
        self.held = anyio.Event()
        self.opened = anyio.Event()

    async def generate(self, request: Request) -> Any:  # pragma: no cover - streams only
        raise NotImplementedError

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        yield TextDelta(index=0, text="Hel")
        self.held.set()
        await self.opened.wait()
        yield TextDelta(index=0, text="lo")
        yield Stop(stop_reason=StopReason.END_TURN)


@pattern
def writer(prompt: str = ""):
    gen = generate_text(prompt, system="Be brief.")
    return {"pending": gen.pending, "result": gen.result, "error": gen.error,
            "partial": gen.partial}


def _out(inst: Any, key: str) -> Any:
    return inst.result.key(key).get()


async def _landed(inst: Any, key: str, want: Callable[[Any], bool]) -> None:
    """Wait (bounded) until the output ``key`` holds a value ``want`` accepts."""
    seen = anyio.Event()
    dispose = inst.result.key(key).sink(lambda v: want(v) and seen.set())
    try:
        with anyio.fail_after(10):
            await seen.wait()
    finally:
        dispose()


async def test_a_prompt_generates_its_text_into_result():
    model = ScriptedModel(["Paris."])
    async with Runtime(model=model) as rt:
        inst = rt.run(writer, {"prompt": "Capital of France?"})
        await rt.settled()
        assert _out(inst, "result") == "Paris."
        assert _out(inst, "pending") is False
        assert _out(inst, "error") is None and _out(inst, "partial") is None
        (request,) = model.requests
        assert request.system == "Be brief."
        assert [(m.role, m.text_content()) for m in request.messages] == [
            ("user", "Capital of France?")]
        assert request.tools == ()


async def test_partial_shows_the_streamed_text_while_pending():
    model = Streaming()
    async with Runtime(model=model) as rt:
        inst = rt.run(writer, {"prompt": "greet"})
        await rt.idle()
        with anyio.fail_after(10):
            await model.held.wait()
        assert _out(inst, "partial") == "Hel"
        assert _out(inst, "pending") is True and _out(inst, "result") is None
        model.opened.set()
        await rt.settled()
        assert _out(inst, "result") == "Hello"
        assert _out(inst, "partial") is None and _out(inst, "pending") is False


@pattern
def shared_writer():
    prompt = cell("Name a colour.", name="prompt")  # space-wide: sessions share the node
    gen = generate_text(prompt)
    return {"prompt": prompt, "result": gen.result, "pending": gen.pending}


async def test_the_same_request_makes_no_second_call_and_a_changed_one_does():
    model = ScriptedModel(["Blue.", "Green."])
    async with Runtime(model=model) as rt:
        a = rt.run(shared_writer, session="s1")
        await rt.settled()
        assert _out(a, "result") == "Blue." and len(model.requests) == 1
        b = rt.run(shared_writer, session="s2")  # another node over the same request
        rt.stop(a)
        a = rt.run(shared_writer, session="s1")  # the node built again
        await rt.settled()
        assert len(model.requests) == 1
        assert _out(a, "result") == _out(b, "result") == "Blue."
        a.result.key("prompt").set("Name a colour.")  # written, but the same value
        await rt.settled()
        assert len(model.requests) == 1
        a.result.key("prompt").set("Name another colour.")
        await rt.settled()
        assert len(model.requests) == 2
        assert _last_user_text(model.requests[1]) == "Name another colour."
        assert _out(a, "result") == _out(b, "result") == "Green."


async def test_an_instance_over_a_request_in_flight_joins_it():
    model = Held()
    async with Runtime(model=model) as rt:
        a = rt.run(shared_writer, session="s1")
        await rt.idle()
        await model.calls_reach(1)
        b = rt.run(shared_writer, session="s2")
        await rt.idle()
        assert _out(b, "pending") is True
        model.gate("Name a colour.").set()
        await rt.settled()
        assert model.calls == ["Name a colour."]
        assert _out(a, "result") == _out(b, "result") == "re: Name a colour."


async def test_a_restart_keeps_the_result_without_calling_the_model(tmp_path):
    store = f"sqlite:///{tmp_path / 'state.db'}"
    async with Runtime(store, model=ScriptedModel(["Paris."])) as rt:
        rt.run(writer, {"prompt": "Capital of France?"})
        await rt.settled()
    again = ScriptedModel([])  # any call would fail: the script is empty
    async with Runtime(store, model=again) as rt:
        inst = rt.run(writer, {"prompt": "Capital of France?"})
        await rt.settled()
        assert again.requests == []
        assert _out(inst, "result") == "Paris." and _out(inst, "error") is None


async def test_a_result_stored_by_the_earlier_layout_is_kept_without_calling_the_model(
        tmp_path, monkeypatch):
    """Before records, each of a generation's cells was a document of its own: a store
    written then still answers its request (``BuiltinNode.record(earlier=True)``)."""
    from runtime.cells import BuiltinNode
    from runtime.cells.ids import derive
    from runtime.storage import DocKey, SQLiteStore, Write

    nodes: list[Any] = []
    record = BuiltinNode.record
    monkeypatch.setattr(BuiltinNode, "record",
                        lambda self, *a, **k: (nodes.append(self), record(self, *a, **k))[1])
    async with Runtime(f"sqlite:///{tmp_path / 'now.db'}",
                       model=ScriptedModel(["Paris."])) as rt:
        inst = rt.run(writer, {"prompt": "Capital of France?"})
        await rt.settled()
        node = nodes[0]
        # every cell as the earlier layout stored it: the records' fields, and the result
        stored = {"result": inst.result.key("result").get()}
        for name in ("pending", "error"):  # one field of each record
            stored.update(rt.store.load(inst.result.key(name).resolve().doc_key).value)
    assert stored["result"] == "Paris." and stored["request"] and stored["pending"] is False
    old = SQLiteStore(str(tmp_path / "old.db"))  # each field where the earlier layout put it
    old.commit([Write(DocKey(node.space, node.scope.key, derive(node.cause, "state", f)), v, 0)
                for f, v in stored.items()])
    old.close()
    again = ScriptedModel([])  # any call would fail: the script is empty
    async with Runtime(f"sqlite:///{tmp_path / 'old.db'}", model=again) as rt:
        inst = rt.run(writer, {"prompt": "Capital of France?"})
        await rt.settled()
        assert again.requests == []
        assert _out(inst, "result") == "Paris." and _out(inst, "error") is None


async def test_a_generation_cut_short_by_a_restart_runs_again(tmp_path):
    store = f"sqlite:///{tmp_path / 'state.db'}"
    held = Held()
    async with Runtime(store, model=held) as rt:
        inst = rt.run(writer, {"prompt": "hi"})
        await rt.idle()
        await held.calls_reach(1)
        assert _out(inst, "pending") is True
    # the process stopped with the generation pending; nothing runs it any more
    model = ScriptedModel(["hello again"], name="held")  # the same model: the same request
    async with Runtime(store, model=model) as rt:
        inst = rt.run(writer, {"prompt": "hi"})
        await rt.settled()
        assert len(model.requests) == 1
        assert _out(inst, "result") == "hello again" and _out(inst, "pending") is False


async def test_an_empty_prompt_makes_no_request_and_clears_the_result():
    model = ScriptedModel(["An answer."])
    async with Runtime(model=model) as rt:
        inst = rt.run(writer)
        await rt.settled()
        assert model.requests == []
        assert _out(inst, "result") is None and _out(inst, "pending") is False
        inst.argument.key("prompt").set("   ")
        await rt.settled()
        assert model.requests == []
        inst.argument.key("prompt").set("A question?")
        await rt.settled()
        assert _out(inst, "result") == "An answer."
        inst.argument.key("prompt").set("")
        await rt.settled()
        assert len(model.requests) == 1
        assert _out(inst, "result") is None and _out(inst, "pending") is False
        assert _out(inst, "error") is None


@pattern
def chat_reply():
    messages = cell([], name="messages")
    gen = generate_text(messages=messages)
    return {"messages": messages, "result": gen.result, "pending": gen.pending}


async def test_messages_are_the_history_sent_and_an_empty_list_asks_nothing():
    model = ScriptedModel(["Fine, thanks."])
    async with Runtime(model=model) as rt:
        inst = rt.run(chat_reply)
        await rt.settled()
        assert model.requests == []
        history = [Message.text("user", "Hi."), Message.text("assistant", "Hello!"),
                   Message.text("user", "How are you?")]
        inst.result.key("messages").set([m.model_dump(mode="json") for m in history])
        await rt.settled()
        assert [m.text_content() for m in model.requests[0].messages] == [
            "Hi.", "Hello!", "How are you?"]
        assert _out(inst, "result") == "Fine, thanks."


@pytest.mark.parametrize("script, expect", [
    ([RuntimeError("boom")], "boom"),
    ([""], "empty reply"),
    ([], "script exhausted"),
])
async def test_a_failed_generation_sets_error_and_is_not_pending(script, expect):
    async with Runtime(model=ScriptedModel(script)) as rt:
        inst = rt.run(writer, {"prompt": "go"})
        await rt.settled()
        assert expect in _out(inst, "error")
        assert _out(inst, "pending") is False and _out(inst, "result") is None


async def test_a_request_that_failed_is_tried_again_when_the_node_is_built_again():
    model = ScriptedModel([RuntimeError("down"), "up"])
    async with Runtime(model=model) as rt:
        inst = rt.run(writer, {"prompt": "status?"})
        await rt.settled()
        assert "down" in _out(inst, "error")
        rt.stop(inst)
        inst = rt.run(writer, {"prompt": "status?"})
        await rt.settled()
        assert _out(inst, "result") == "up" and _out(inst, "error") is None
        assert len(model.requests) == 2


async def test_no_model_anywhere_and_a_prompt_that_is_not_text_are_clear_errors():
    async with Runtime() as rt:
        inst = rt.run(writer, {"prompt": "go"})
        await rt.settled()
        assert "Runtime(model=...)" in _out(inst, "error")
        assert _out(inst, "pending") is False

    @pattern
    def numbers():
        prompt = cell(5, name="prompt")
        gen = generate_text(prompt)
        return {"error": gen.error, "pending": gen.pending}

    model = ScriptedModel(["never"])
    async with Runtime(model=model) as rt:
        inst = rt.run(numbers)
        await rt.settled()
        assert "the prompt must be a string, got int" in _out(inst, "error")
        assert _out(inst, "pending") is False and model.requests == []


async def test_a_newer_prompt_supersedes_the_one_in_flight():
    model = Held()
    async with Runtime(model=model) as rt:
        inst = rt.run(writer, {"prompt": "first"})
        await rt.idle()
        await model.calls_reach(1)
        inst.argument.key("prompt").set("second")
        await rt.idle()
        await model.calls_reach(2)
        assert _out(inst, "pending") is True
        model.gate("first").set()
        model.gate("second").set()
        await rt.settled()
        assert model.calls == ["first", "second"]
        assert model.finished == ["second"]  # the first was cancelled: no reply at all
        assert _out(inst, "result") == "re: second" and _out(inst, "pending") is False


async def test_a_late_answer_that_slips_past_its_cancellation_lands_nowhere():
    model = Held(shield=True)  # the first reply completes although it was cancelled
    async with Runtime(model=model) as rt:
        inst = rt.run(writer, {"prompt": "first"})
        await rt.idle()
        await model.calls_reach(1)
        inst.argument.key("prompt").set("second")
        await rt.idle()
        await model.calls_reach(2)
        model.gate("second").set()
        await _landed(inst, "result", lambda v: v is not None)
        assert _out(inst, "result") == "re: second"
        model.gate("first").set()  # the older answer arrives last
        await rt.settled()
        assert sorted(model.finished) == ["first", "second"]
        assert _out(inst, "result") == "re: second"
        assert _out(inst, "pending") is False and _out(inst, "error") is None


async def test_stopping_the_instance_cancels_its_generation():
    model = Held()
    async with Runtime(model=model) as rt:
        inst = rt.run(writer, {"prompt": "hi"})
        await rt.idle()
        await model.calls_reach(1)
        rt.stop(inst)
        model.gate("hi").set()
        await rt.settled()
        assert model.finished == [] and _out(inst, "result") is None


async def test_generate_text_with_tools_answers_after_they_ran():
    looked_up.clear()

    @pattern
    def helper():
        seen = cell([], name="seen")
        gen = generate_text("Who is Ada?", tools={"lookup": lookup(seen=seen)})
        return {"seen": seen, "result": gen.result, "partial": gen.partial}

    model = ScriptedModel([Reply(text="Let me look.", tool_calls=[call("lookup", {"name": "Ada"})]),
                           "A mathematician."])
    async with Runtime(model=model) as rt:
        inst = rt.run(helper)
        await rt.settled()
        assert _out(inst, "seen") == ["Ada"]
        assert _out(inst, "result") == "A mathematician." and _out(inst, "partial") is None
        assert [t.name for t in model.requests[0].tools] == ["lookup"]


class Person(BaseModel):
    name: str
    born: int


def _person_pattern(**kw: Any) -> Any:
    @pattern
    def extract(text: str = "Ada Lovelace, born 1815."):
        gen = generate_object(text, schema=Person, **kw)
        return {"pending": gen.pending, "result": gen.result, "error": gen.error}

    return extract


@pytest.mark.parametrize("answer", [
    '{"name": "Ada", "born": 1815}',
    '```json\n{"name": "Ada", "born": 1815}\n```',
])
async def test_generate_object_parses_the_json_answer(answer):
    model = ScriptedModel([answer])
    async with Runtime(model=model) as rt:
        inst = rt.run(_person_pattern())
        await rt.settled()
        assert _out(inst, "result") == {"name": "Ada", "born": 1815}
        assert _out(inst, "error") is None
        system = model.requests[0].system
        assert "JSON" in system and '"born"' in system
        assert model.requests[0].tools == ()


@pytest.mark.parametrize("answer, expect", [
    ("Ada, 1815", "the model's answer is not JSON"),
    ('{"name": "Ada"}', "does not match the schema"),
    ('{"name": "Ada", "born": "1815"}', "does not match the schema"),
    ('{"name": "Ada", "born": NaN}', "NaN is not JSON"),
])
async def test_generate_object_refuses_an_answer_that_is_not_the_schemas(answer, expect):
    async with Runtime(model=ScriptedModel([answer])) as rt:
        inst = rt.run(_person_pattern())
        await rt.settled()
        assert expect in _out(inst, "error")
        assert _out(inst, "result") is None and _out(inst, "pending") is False


looked_up: list[str] = []


@handler
def lookup(event, seen):
    looked_up.append(event["name"])
    seen.push(event["name"])


async def test_generate_object_with_tools_ends_when_present_result_is_called():
    looked_up.clear()

    @pattern
    def research():
        seen = cell([], name="seen")
        gen = generate_object("Who wrote the first program?", schema=Person, tools={
            "lookup": {"description": "Look a person up", "handler": lookup(seen=seen)}})
        return {"seen": seen, "result": gen.result, "error": gen.error,
                "pending": gen.pending}

    model = ScriptedModel([
        Reply(tool_calls=[call("lookup", {"name": "Ada"})]),
        Reply(text="Found her.", tool_calls=[call("presentResult",
                                                  {"name": "Ada", "born": 1815})]),
        "never asked",
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(research)
        await rt.settled()
        assert _out(inst, "result") == {"name": "Ada", "born": 1815}
        assert _out(inst, "error") is None and _out(inst, "pending") is False
        assert len(model.requests) == 2  # no model call after presentResult
        assert looked_up == ["Ada"] and _out(inst, "seen") == ["Ada"]
        tools = {t.name: t for t in model.requests[0].tools}
        assert list(tools) == ["lookup", "presentResult"]
        assert tools["presentResult"].input_schema["required"] == ["name", "born"]


async def test_generate_object_with_tools_wraps_a_schema_that_is_not_an_object():
    @pattern
    def colours():
        seen = cell([], name="seen")
        gen = generate_object("Three colours", schema=list[str],
                              tools={"lookup": lookup(seen=seen)})
        return {"result": gen.result, "error": gen.error}

    model = ScriptedModel([Reply(tool_calls=[call("presentResult",
                                                  {"result": ["red", "green", "blue"]})])])
    async with Runtime(model=model) as rt:
        inst = rt.run(colours)
        await rt.settled()
        assert _out(inst, "result") == ["red", "green", "blue"]
        schema = model.requests[0].tools[-1].input_schema
        assert schema["properties"]["result"]["type"] == "array"


@pytest.mark.parametrize("script, expect", [
    (["Ada Lovelace, 1815."], "without calling presentResult"),
    ([Reply(tool_calls=[call("lookup", {"name": "x"})])] * 2, "max_steps"),
])
async def test_generate_object_with_tools_errors_when_present_result_is_never_called(
        script, expect):
    @pattern
    def research():
        seen = cell([], name="seen")
        gen = generate_object("Who?", schema=Person, tools={"lookup": lookup(seen=seen)},
                              max_steps=2)
        return {"result": gen.result, "error": gen.error, "pending": gen.pending}

    async with Runtime(model=ScriptedModel(script)) as rt:
        inst = rt.run(research)
        await rt.settled()
        error = _out(inst, "error")
        assert expect in error and "presentResult" in error
        assert _out(inst, "result") is None and _out(inst, "pending") is False


@pytest.mark.parametrize("build, expect", [
    (lambda: generate_text(), "needs a prompt"),
    (lambda: generate_text("a", messages=cell([], name="m")), "not both"),
    (lambda: generate_text(5), "takes a str or a Cell"),
    (lambda: generate_text("a", max_steps=0), "max_steps"),
    (lambda: generate_text("a", tools={"presentResult": lookup(seen=cell([], name="s"))}),
     "reserved"),
    (lambda: generate_object("a", schema=None), "needs a schema"),
])
async def test_building_refuses_what_cannot_work(build, expect):
    @pattern
    def broken():
        build()
        return {}

    async with Runtime(model=ScriptedModel([])) as rt:
        with pytest.raises(PatternError, match=expect):
            rt.run(broken)


async def test_an_invalid_schema_is_refused_while_building():
    @pattern
    def broken():
        generate_object("a", schema={"type": "nonsense"})
        return {}

    async with Runtime(model=ScriptedModel([])) as rt:
        with pytest.raises(SchemaError, match="invalid JSON Schema"):
            rt.run(broken)


@pattern(name="generate-two-processes")
def prompted():
    prompt = cell("hello", name="prompt")
    gen = generate_text(prompt)
    return {"pending": gen.pending, "result": gen.result, "error": gen.error}


@pytest.mark.parametrize("fails", [True, False])
async def test_an_outcome_written_by_another_process_meanwhile_does_not_lose_the_end(
        tmp_path, fails):
    """B writes the generation's error (its outcome record) while A's model call runs, and
    A's copy is behind: A's end conflicts, is written again on the fresh state, and lands
    (before, the conflict escaped and the generation stayed pending for good)."""
    from .support import Gate

    url = f"sqlite:///{tmp_path / 'two.db'}"
    model = Gate([RuntimeError("model boom") if fails else "the answer"])
    async with Runtime(store=url, model=model) as a_rt, \
            Runtime(store=url, model=ScriptedModel([])) as b_rt:
        a = a_rt.run(prompted)
        with anyio.fail_after(10):
            await model.started.wait()
        error = b_rt.run(prompted).result.key("error")  # A's live turn: B runs nothing
        error.refresh()
        error.set("set by B")
        model.opened.set()
        with anyio.fail_after(10):
            await a_rt.settled()
        assert _out(a, "pending") is False
        if fails:
            assert "model boom" in _out(a, "error") and _out(a, "result") is None
        else:
            assert _out(a, "result") == "the answer" and _out(a, "error") is None
