"""The ``Evaluator``: every eval on every model, several attempts each, in parallel.

Dagger's Evaluator (https://dagger.io: its LLM API, https://docs.dagger.io/features/llm) with
what its authors wished it measured: turns and wall time beside success rates and tokens. One
run is one anyio task group: every attempt of every model x eval is a task in it, and a
``CapacityLimiter`` bounds how many run at once (so a provider's rate limit or a laptop's
cores set the pace, not the number of attempts). A model that serves one request at a time
(the local model: ``serves_at_once``) has a limiter of its own too, so its attempts run one
after another instead of waiting for each other inside it. An attempt's time is its own:
from when it got its slots to its end (``seconds``); the wait for them is ``queue_seconds``.
Each attempt runs on its own fork of the base conversation and its own metered model, so
attempts share nothing. An attempt's failure (a failed check, a model error, a step limit,
a timeout) is recorded, never raised; cancelling the run cancels every attempt and the run
raises the cancellation: no attempt outlives it.

    report = await (Evaluator()
                    .with_system_prompt("Use the tools you are given.")
                    .with_evals([CountsNotes(), says_hello])
                    .run(models=["sonnet", "openai:gpt-4.1"], attempts=5, concurrency=8))
    print(report.to_markdown()); raise SystemExit(report.exit_status)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from .core import BaseEval, Record, describe_failure
from .eval_models import EvalModel, Meter, ModelLike, eval_model
from .report import DEFAULT_THRESHOLD, Attempt, EvalResult, Report

if TYPE_CHECKING:
    from ..conversation import LLM
    from ..llm.model import Model

__all__ = ["DEFAULT_CONCURRENCY", "Evaluator"]

DEFAULT_CONCURRENCY = 8
"""Attempts running at once when ``run`` is not told (Dagger's evaluator ran 10-20 at a time)."""


@dataclass(frozen=True)
class Evaluator:
    """Runs evals across models. Immutable: every ``with_*`` returns a new evaluator.

    ``system_prompts`` and ``docs`` go into every attempt's conversation (``docs`` as a
    ``# Documentation`` section of the system prompt); a ``PatternEval`` keeps its own
    pattern's prompt. ``threshold``: the success rate each model x eval must reach.
    ``timeout``: seconds an attempt may take (a slower one fails)."""

    evals: tuple[BaseEval, ...] = ()
    system_prompts: tuple[str, ...] = ()
    docs: tuple[str, ...] = ()
    default_system_prompt: bool = True
    threshold: float = DEFAULT_THRESHOLD
    timeout: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, int | float) and 0 <= self.threshold <= 1):
            raise ValueError(f"threshold is a success rate between 0 and 1, got "
                             f"{self.threshold!r}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout is a number of seconds above 0, got {self.timeout!r}")
        seen: dict[str, BaseEval] = {}
        for e in self.evals:
            if not isinstance(e, BaseEval):
                raise TypeError(f"with_evals takes Eval or PatternEval instances, got "
                                f"{e!r}" + (" (a class: instantiate it)" if isinstance(e, type)
                                            else ""))
            if not (isinstance(e.name, str) and e.name.strip()):
                raise ValueError(f"{e!r} has no name: set `name`")
            if e.name in seen and seen[e.name] is not e:
                raise ValueError(f"two evals are named {e.name!r} ({seen[e.name]!r} and "
                                 f"{e!r}): rename one")
            seen[e.name] = e

    # -- building --------------------------------------------------------------------

    def with_evals(self, evals: Iterable[BaseEval]) -> Evaluator:
        """Add evals (an eval already added is kept once)."""
        added = tuple(e for e in evals if all(e is not x for x in self.evals))
        return replace(self, evals=self.evals + added)

    def only(self, names: Iterable[str]) -> Evaluator:
        """Keep the evals named ``names`` (an unknown name is a ``KeyError`` listing the
        known ones)."""
        wanted = list(names)
        known = {e.name: e for e in self.evals}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise KeyError(f"no eval named {', '.join(map(repr, unknown))}; the evals: "
                           f"{', '.join(known) or 'none'}")
        return replace(self, evals=tuple(e for e in self.evals if e.name in wanted))

    def with_system_prompt(self, prompt: str) -> Evaluator:
        """Add a system prompt to every attempt's conversation."""
        return replace(self, system_prompts=(*self.system_prompts, _text(prompt)))

    def with_system_prompt_file(self, path: str | os.PathLike[str]) -> Evaluator:
        """Add a file's contents as a system prompt."""
        return self.with_system_prompt(Path(path).read_text(encoding="utf-8"))

    def without_default_system_prompt(self) -> Evaluator:
        """Leave out the conversation's default system prompt."""
        return replace(self, default_system_prompt=False)

    def with_docs(self, docs: str) -> Evaluator:
        """Give every attempt documentation to work from (in the system prompt)."""
        return replace(self, docs=(*self.docs, _text(docs)))

    def with_docs_file(self, path: str | os.PathLike[str]) -> Evaluator:
        """Add a file's contents as documentation."""
        return self.with_docs(Path(path).read_text(encoding="utf-8"))

    def with_threshold(self, threshold: float) -> Evaluator:
        """Set the success rate each model x eval must reach."""
        return replace(self, threshold=threshold)

    def with_timeout(self, seconds: float | None) -> Evaluator:
        """Fail an attempt that takes longer than ``seconds``."""
        return replace(self, timeout=seconds)

    def base(self, model: Model | str | None = None) -> LLM:
        """The conversation every attempt starts from, on ``model``."""
        from ..conversation import LLM

        llm = LLM(model=model)
        if not self.default_system_prompt:
            llm = llm.without_default_system_prompt()
        for prompt in self.system_prompts:
            llm = llm.with_system_prompt(prompt)
        for text in self.docs:
            llm = llm.with_system_prompt("# Documentation\n\n" + text)
        return llm

    # -- running ---------------------------------------------------------------------

    async def run(self, models: Sequence[ModelLike] | None = None, attempts: int = 1,
                  concurrency: int | None = None, *,
                  on_attempt: Callable[[Attempt], None] | None = None) -> Report:
        """Run every eval ``attempts`` times on every model, at most ``concurrency``
        attempts at once (default ``DEFAULT_CONCURRENCY``); ``on_attempt`` is told of each
        attempt as it ends (an exception it raises ends the run). ``models`` default to the
        configured one (``CELLDIALOG_MODEL``, else the local model). Raises
        ``ConfigurationError`` for a model that cannot be resolved, before anything runs."""
        _positive(attempts, "attempts")
        if concurrency is not None:
            _positive(concurrency, "concurrency")
        if not self.evals:
            raise ValueError("no evals to run: add some with with_evals([...])")
        chosen = _models(models)
        limiter = anyio.CapacityLimiter(concurrency or DEFAULT_CONCURRENCY)
        own = {m.label: anyio.CapacityLimiter(m.concurrency) for m in chosen if m.concurrency}
        done: list[Attempt] = []
        started = time.perf_counter()
        try:
            async with anyio.create_task_group() as tg:
                for m in chosen:
                    for e in self.evals:
                        for n in range(1, attempts + 1):
                            tg.start_soon(self._attempt, m, e, n, (own.get(m.label), limiter),
                                          done, on_attempt,
                                          name=f"eval {e.name} on {m.label} #{n}")
        finally:
            for m in chosen:
                if m.close is not None:
                    with anyio.CancelScope(shield=True):
                        await _close(m.close)
        seconds = time.perf_counter() - started
        results = []
        for m in chosen:
            for e in self.evals:
                mine = [a for a in done if a.model == m.label and a.eval == e.name]
                results.append(EvalResult.of(mine))
        return Report(tuple(results), self.threshold, seconds, tuple(done))

    async def _attempt(self, m: EvalModel, e: BaseEval, n: int,
                       limiters: tuple[anyio.CapacityLimiter | None, anyio.CapacityLimiter],
                       done: list[Attempt], on_attempt: Callable[[Attempt], None] | None) -> None:
        from ..llm.safety import redact_secrets as redact

        queued = time.perf_counter()
        async with AsyncExitStack() as slots:
            # the model's own slot first: an attempt waiting for the local model holds none
            # of the run's slots, which other models' attempts can use meanwhile
            for slot in limiters:
                if slot is not None:
                    await slots.enter_async_context(slot)
            record = Record()
            meter: Meter | None = None
            message = ""
            started = time.perf_counter()
            queue = started - queued
            try:
                meter = Meter(m.build(e.name, n))
                base = self.base(meter).fork(f"{e.name}#{n}")
                await e.attempt(base, meter, record, self.timeout)
            except Exception as error:
                message = describe_failure(record.phase, error)
            seconds = time.perf_counter() - started
        usage = record.usage if record.usage is not None else (
            meter.usage if meter is not None else None)
        attempt = Attempt(
            m.label, e.name, n, not message,
            usage.input_tokens if usage else 0, usage.output_tokens if usage else 0,
            usage.cache_read_tokens if usage else 0, usage.cache_write_tokens if usage else 0,
            meter.calls if meter is not None else 0, seconds, redact(message),
            redact(record.transcript) if message else "", queue)
        done.append(attempt)
        if on_attempt is not None:
            on_attempt(attempt)


def _models(models: Sequence[ModelLike] | None) -> list[EvalModel]:
    if models is None:
        models = [""]  # the configured default
    elif isinstance(models, str):
        models = [models]
    chosen = [eval_model(m) for m in models]
    labels = [m.label for m in chosen]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"two models are labelled {twice[0]!r}: each model x eval is one row "
                         "of the report, so give each model once (or its own label)")
    if not chosen:
        raise ValueError("no models to run the evals on")
    return chosen


async def _close(close: Callable[[], object]) -> None:
    import inspect

    result = close()
    if inspect.isawaitable(result):
        await result


def _positive(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def _text(value: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected non-empty text, got {value!r}")
    return value
