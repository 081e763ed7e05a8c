"""OpenTelemetry spans for the conversation object, when OpenTelemetry is there.

One span per ``step``/``loop`` evaluated (``celldialog.llm.loop``, with the agent's handle
when an agent runs it), one per model call beneath it (``chat <model>``: provider, model,
tokens, error) and one per tool call beneath that (``execute_tool <name>``: tool name, call
id, error). The attribute names follow OpenTelemetry's GenAI conventions.

Nothing is done, and nothing imported, unless the ``opentelemetry`` API is importable and a
real tracer provider is configured (``pip install 'celldialog[telemetry]'`` and set one up):
with no provider the API's spans are no-ops anyway, so they are not even made. The check
is made once per evaluation, so a provider configured later is picked up.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from typing import Any

from ..llm.types import Message, Role, ToolResult, Usage

__all__ = ["StepSpans", "emit_history", "tracer"]

_NAME = "celldialog.conversation"


def _importable() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry") is not None
    except (ImportError, ValueError):  # blocked (sys.modules entry None) or broken
        return False


_AVAILABLE = _importable()


def tracer() -> Any | None:
    """The tracer to use now, or None when there is nothing to report to."""
    if not _AVAILABLE:
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer(_NAME)


def _usage_attributes(usage: Usage) -> dict[str, int]:
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read_input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation_input_tokens": usage.cache_write_tokens,
    }


class StepSpans:
    """The spans of one ``step``/``loop`` op, fed by the step engine's sink callbacks."""

    def __init__(self, tracer: Any, *, kind: str, provider: str, model: str,
                 agent: str | None = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer
        self._model = model
        self._provider = provider
        attributes: dict[str, Any] = {"celldialog.llm.op": kind, "gen_ai.system": provider,
                                      "gen_ai.request.model": model}
        if agent is not None:
            attributes["celldialog.agent.id"] = agent
        self._loop = tracer.start_span("celldialog.llm.loop", attributes=attributes)
        self._step: Any = None
        self._names: dict[str, str] = {}
        self._mark = 0

    def _in(self, span: Any) -> Any:
        return self._trace.set_span_in_context(span)

    def on_step(self, step: int) -> None:
        self._end_step()
        self._step = self._tracer.start_span(
            f"chat {self._model}", context=self._in(self._loop),
            attributes={"gen_ai.operation.name": "chat", "gen_ai.system": self._provider,
                        "gen_ai.request.model": self._model, "celldialog.llm.step": step})

    def on_usage(self, usage: Usage) -> None:
        if self._step is not None:
            self._step.set_attributes(_usage_attributes(usage))

    def on_message(self, message: Message) -> None:
        if message.role is Role.ASSISTANT:
            for call in message.tool_uses():
                self._names[call.id] = call.name
            self._mark = time.time_ns()

    def on_tool_result(self, result: ToolResult) -> None:
        start, self._mark = self._mark, time.time_ns()
        name = self._names.get(result.tool_use_id, "")
        span = self._tracer.start_span(
            f"execute_tool {name}", context=self._in(self._step or self._loop),
            start_time=start or None,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                        "gen_ai.tool.call.id": result.tool_use_id})
        if result.is_error:
            _fail(self._trace, span, "tool_error", result.content)
        span.end()

    def failed(self, error: BaseException | str) -> None:
        """The op ended in an error (the model's, a step limit, a cancellation)."""
        kind = type(error).__name__ if isinstance(error, BaseException) else "error"
        for span in (self._step, self._loop):
            if span is not None:
                _fail(self._trace, span, kind, str(error))

    def close(self, usage: Usage) -> None:
        self._end_step()
        self._loop.set_attributes(_usage_attributes(usage))
        self._loop.end()

    def _end_step(self) -> None:
        if self._step is not None:
            self._step.end()
            self._step = None


def _fail(trace: Any, span: Any, kind: str, message: str) -> None:
    span.set_attribute("error.type", kind)
    span.set_status(trace.Status(trace.StatusCode.ERROR, message[:500]))


def emit_history(messages: Sequence[Message], *, provider: str, model: str) -> bool:
    """Spans for a whole history (a loaded conversation): one loop span, a ``chat`` span per
    assistant message, an ``execute_tool`` span per call with its result's error. Returns
    whether anything was emitted."""
    t = tracer()
    if t is None:
        return False
    spans = StepSpans(t, kind="history", provider=provider, model=model)
    step = 0
    for m in messages:
        if m.role is Role.ASSISTANT:
            step += 1
            spans.on_step(step)
            spans.on_message(m)
        else:
            for b in m.blocks:
                if isinstance(b, ToolResult):
                    spans.on_tool_result(b)
    spans.close(Usage())
    return True
