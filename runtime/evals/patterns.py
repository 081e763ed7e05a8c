"""Patterns with an ``llm_dialog`` as evals: the prompt goes to the dialog's ``add_message``
stream, ``check`` reads the result cells.

Each attempt runs in a fresh ``Runtime`` (a memory store) whose default model is the
attempt's model, so the pattern is measured as a user meets it: its own system prompt, its
own tools, its own scopes. A dialog that names its own model (``llm_dialog(model=...)``)
keeps it and is not what the evaluator measures. Turns are the model calls; tokens come
from the dialog's ``usage`` output when the result has one, else from the calls.

A subclass::

    class AddsMilk(PatternEval):
        pattern = todo_agent
        prompt = "Remind me to buy milk."

        def check(self, run: PatternRun) -> None:
            assert run.value("items") == [{"title": "milk", "done": False}]

or the constructor: ``PatternEval("adds-milk", todo_agent, "Remind me...", check=fn)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..llm.types import Message, Usage
from .core import BaseEval, Record, _settle

if TYPE_CHECKING:
    from ..cells import Instance, Pattern, Runtime
    from ..conversation import LLM
    from ..llm.model import Model

__all__ = ["PatternEval", "PatternRun"]


class PatternRun:
    """A pattern instance after the prompt's turns, for ``check`` to read (the runtime is
    still open: cells can be read, streams sent to)."""

    def __init__(self, runtime: Runtime, instance: Instance, messages_key: str) -> None:
        self.runtime = runtime
        self.instance = instance
        self._messages_key = messages_key

    def value(self, key: str, default: Any = None) -> Any:
        """The value of the result's cell at ``key`` (dotted for nested keys), or
        ``default`` when the result has no such key."""
        value = self.instance.result.get()
        for part in key.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return default
        return value

    @property
    def messages(self) -> tuple[Message, ...]:
        """The dialog's history (its ``messages`` cell) as port ``Message``s."""
        raw = self.value(self._messages_key, [])
        return tuple(Message.model_validate(m) for m in raw or ())

    @property
    def transcript(self) -> str:
        """The history as plain text."""
        from ..conversation.history import transcript

        return transcript(self.messages)

    @property
    def error(self) -> str | None:
        """The last turn's error (the result's ``error`` cell), or None."""
        error = self.value("error")
        return error if isinstance(error, str) and error else None


class PatternEval(BaseEval):
    """A pattern as an eval: ``prompt`` (a message, or several sent one turn after another)
    goes to the stream ``send``; ``check(run)`` reads the result (see the module docstring).

    ``setup`` events (``(stream, event)`` pairs) are sent first, to give the pattern state
    the prompt is about. A turn that ends in the dialog's ``error`` fails the attempt."""

    pattern: Pattern | None = None
    prompt: str | Sequence[str] = ""
    args: dict[str, Any] | None = None
    setup: Sequence[tuple[str, Any]] = ()
    send: str = "send"
    messages: str = "messages"
    usage: str = "usage"
    user: str | None = "eval"

    def __init__(self, name: str | None = None, pattern: Pattern | None = None,
                 prompt: str | Sequence[str] | None = None, *,
                 check: Callable[[PatternRun], Any] | None = None,
                 args: dict[str, Any] | None = None,
                 setup: Sequence[tuple[str, Any]] | None = None, send: str | None = None,
                 messages: str | None = None, usage: str | None = None) -> None:
        for attr, value in (("name", name), ("pattern", pattern), ("prompt", prompt),
                            ("args", args), ("setup", setup), ("send", send),
                            ("messages", messages), ("usage", usage)):
            if value is not None:
                setattr(self, attr, value)
        if check is not None:
            self._check_fn = check
        if type(self) is PatternEval and name is None:
            raise TypeError("PatternEval(name, pattern, prompt, check=...) needs a name")
        if self.pattern is None:
            raise TypeError(f"pattern eval {self.name!r} has no pattern: pass one, or set "
                            "the class attribute `pattern`")
        if not self.prompts:
            raise TypeError(f"pattern eval {self.name!r} has no prompt: the message(s) to "
                            f"send to its {self.send!r} stream")

    @property
    def prompts(self) -> tuple[str, ...]:
        """The messages sent, one turn each."""
        p = self.prompt
        return (p,) if isinstance(p, str) and p.strip() else (
            tuple(p) if not isinstance(p, str) else ())

    def check(self, run: PatternRun) -> Any:
        """Raise (``assert``) if the result is not what was wanted; by default, accept any
        run whose turns ended without an error."""
        fn = getattr(self, "_check_fn", None)
        return fn(run) if fn is not None else None

    async def attempt(self, base: LLM, model: Model, record: Record,
                      timeout: float | None) -> None:
        from ..cells import Runtime

        record.phase = "setup"
        async with Runtime(model=model) as rt:
            inst = rt.run(self.pattern, self.args, user=self.user,
                          session=f"eval-{base.id}")  # type: ignore[arg-type]
            run = PatternRun(rt, inst, self.messages)
            missing = [n for n in (self.send, *(s for s, _ in self.setup))
                       if n not in inst.streams]
            if missing:
                known = ", ".join(sorted(inst.streams)) or "none"
                raise LookupError(
                    f"pattern {inst.pattern.name} has no stream {missing[0]!r} (its streams: "
                    f"{known}): set PatternEval(send=...) to its dialog's add_message stream")
            try:
                with anyio.fail_after(timeout if timeout is not None else float("inf")):
                    for stream, event in self.setup:
                        await inst.send(stream, event)
                    await rt.settled()
                    record.phase = "run"
                    for text in self.prompts:
                        await inst.send(self.send, text)
                        await rt.settled()  # the turn has ended
                        if run.error:
                            raise RuntimeError(f"the dialog's turn failed: {run.error}")
                if rt.errors:
                    where, error = rt.errors[0]
                    raise RuntimeError(f"{where} failed: {type(error).__name__}: {error}")
            finally:
                record.transcript = _safe(lambda: run.transcript, "")
                record.usage = _safe(lambda: _usage(run.value(self.usage)), None)
            record.phase = "check"
            await _settle(self.check(run))


def _usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    fields = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return Usage(**{f: int(value.get(f) or 0) for f in fields})


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:
        return default
