"""What an eval is: a name, a prompt and a check (the ``Eval`` interface of Dagger's
evaluator, https://docs.dagger.io/features/llm).

Two ways to write one. A subclass, when an eval has state or helpers::

    class CountsNotes(Eval):
        name = "counts-notes"

        def prompt(self, base: LLM) -> LLM:
            return base.with_tools(Notes()).with_prompt("Add 'milk', then count.").loop()

        def check(self, llm: LLM) -> None:
            assert "1" in (llm.last_reply or ""), "should have said it has 1 note"

or a decorated check, when the prompt is a line::

    @evaluation(prompt="Say hello.")
    def says_hello(llm: LLM) -> None:
        assert "hello" in (llm.last_reply or "").lower()

``check`` raises on failure (a plain ``assert`` works; one without a message is reported with
its source line) and may be async. A prompt whose queued work leaves something pending (a
``with_prompt`` without ``.loop()``) is looped to the end, so a forgotten ``.loop()`` still
measures the model. Patterns with a dialog are evals too: ``PatternEval`` (``patterns.py``).
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ..llm.types import Message, Usage

if TYPE_CHECKING:
    from ..conversation import LLM
    from ..llm.model import Model

__all__ = ["Eval", "ToolCall", "evaluation", "tool_calls"]

_HERE = str(Path(__file__).resolve().parent)


class Record:
    """What one attempt got to, filled in as it goes (read after it ends, however it ends):
    the phase it is in, its transcript so far, and the usage a pattern reported."""

    __slots__ = ("phase", "transcript", "usage")

    def __init__(self) -> None:
        self.phase = "model"
        self.transcript = ""
        self.usage: Usage | None = None  # None: the meter's count is the usage


class BaseEval:
    """What the evaluator runs: ``name`` and one attempt (``Eval`` and ``PatternEval``)."""

    name: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = cls.__name__

    async def attempt(self, base: LLM, model: Model, record: Record,
                      timeout: float | None) -> None:
        """Run one attempt on ``model`` (``base`` is the evaluator's conversation, forked for
        this attempt, on that model); raise on failure."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class Eval(BaseEval):
    """An eval of a conversation: ``prompt(base)`` returns the conversation to evaluate
    (``base`` carries the evaluator's system prompt and docs, and the model under test);
    ``check(llm)`` reads the evaluated conversation and raises if it is wrong."""

    def prompt(self, base: LLM) -> LLM:
        """The conversation to evaluate, built on ``base``:
        ``base.with_tools(...).with_prompt("...").loop()``."""
        raise NotImplementedError(
            f"eval {self.name!r} has no prompt: define prompt(self, base) returning "
            "base.with_prompt('...').loop()")

    def check(self, llm: LLM) -> Awaitable[None] | None:
        """Raise (``assert``) if the evaluated conversation ``llm`` is not what was wanted.
        The default accepts any conversation that ran to its end."""
        return None

    async def attempt(self, base: LLM, model: Model, record: Record,
                      timeout: float | None) -> None:
        from ..conversation import LLM

        record.phase = "prompt"
        prompted = self.prompt(base)
        if not isinstance(prompted, LLM):
            raise TypeError(
                f"{type(self).__name__}.prompt must return an LLM (base.with_prompt('...')"
                f".loop()), got {type(prompted).__name__}")
        record.phase = "run"
        try:
            with anyio.fail_after(timeout if timeout is not None else float("inf")):
                done = await prompted
                if done.has_pending:  # a prompt without .loop(): run it to the end
                    prompted = done.loop()
                    done = await prompted
        except BaseException:
            record.transcript = _progress(prompted)
            raise
        record.transcript = done.transcript
        record.phase = "check"
        await _settle(self.check(done))


class _FunctionEval(Eval):
    """An eval from ``@evaluation``: the prompt given to the decorator, the function as the
    check."""

    def __init__(self, name: str, prompt: str | Callable[[LLM], LLM],
                 check: Callable[[LLM], Any], max_steps: int | None) -> None:
        self.name = name
        self._prompt = prompt
        self._check = check
        self._max_steps = max_steps
        self.__doc__ = check.__doc__
        self.__wrapped__ = check

    def prompt(self, base: LLM) -> LLM:
        if isinstance(self._prompt, str):
            return base.with_prompt(self._prompt).loop(max_steps=self._max_steps)
        return self._prompt(base)

    def check(self, llm: LLM) -> Any:
        return self._check(llm)

    def __call__(self, llm: LLM) -> Any:
        return self._check(llm)


def evaluation(name: str | None = None, *, prompt: str | Callable[[LLM], LLM],
               max_steps: int | None = None) -> Callable[[Callable[[LLM], Any]], Eval]:
    """Make the decorated function the check of an ``Eval`` named ``name`` (default: the
    function's name). ``prompt`` is the text to send (looped to the end, at most
    ``max_steps`` model calls) or a function ``base -> LLM``."""
    if not (isinstance(prompt, str) and prompt.strip()) and not callable(prompt):
        raise TypeError("evaluation(prompt=...) takes the prompt text or a function base -> LLM")

    def wrap(check: Callable[[LLM], Any]) -> Eval:
        return _FunctionEval(name or check.__name__, prompt, check, max_steps)

    return wrap


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a conversation and what it got back (``result`` None: unanswered)."""

    name: str
    input: dict[str, Any]
    result: str | None = None
    is_error: bool = False


def tool_calls(source: Any) -> list[ToolCall]:
    """The tool calls of a conversation in order, each with its result: ``source`` is an
    evaluated ``LLM``, a ``PatternRun``, or messages (port ``Message``s or their JSON)."""
    messages = _messages_of(source)
    calls: list[tuple[str, str, dict[str, Any]]] = []
    results: dict[str, tuple[str, bool]] = {}
    for m in messages:
        for b in m.blocks:
            if b.kind == "tool_use":
                calls.append((b.id, b.name, dict(b.input)))
            elif b.kind == "tool_result":
                results[b.tool_use_id] = (b.content, b.is_error)
    out = []
    for call_id, name, args in calls:
        content, is_error = results.get(call_id, (None, False))
        out.append(ToolCall(name, args, content, is_error))
    return out


def _messages_of(source: Any) -> Sequence[Message]:
    messages = getattr(source, "messages", source)
    if not isinstance(messages, Iterable) or isinstance(messages, str | bytes | Mapping):
        raise TypeError(f"tool_calls takes an LLM, a PatternRun or messages, got "
                        f"{type(source).__name__}")
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]


def describe_failure(phase: str, error: BaseException) -> str:
    """One attempt's failure as the report says it: the phase, then the error's message; an
    ``assert`` without a message is shown by its source line."""
    if isinstance(error, TimeoutError) and not str(error):
        return f"{phase}: timed out"
    text = str(error).strip()
    if isinstance(error, AssertionError):
        if not text:
            text = "assertion failed" + _source_line(error)
        return f"{phase}: {text}"
    return f"{phase}: {type(error).__name__}: {text}" if text else \
        f"{phase}: {type(error).__name__}"


def _source_line(error: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith(_HERE)]
    if not frames:
        return ""
    last = frames[-1]
    return f" at {Path(last.filename).name}:{last.lineno}: {last.line}" if last.line else \
        f" at {Path(last.filename).name}:{last.lineno}"


def _progress(llm: LLM) -> str:
    try:
        return llm.progress.transcript
    except Exception:  # never evaluated (failed before its first step)
        return ""


async def _settle(value: Any) -> None:
    if inspect.isawaitable(value):
        await value
