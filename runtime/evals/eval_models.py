"""The models an evaluation runs on, and the meter that counts what each attempt cost.

A model under test is an ``EvalModel``: a label (the report's ``model`` column) and a
factory called once per attempt with the eval's name and the attempt's number. Attempts run
in parallel, so a scripted model must be built per attempt (one shared ``ScriptedModel``
would hand each attempt the next step of one script); a provider's adapter is shared (it is
safe for concurrent use and owns a connection pool).

``eval_model`` accepts what a user naturally has:

- a name ``resolve_model`` knows (``"sonnet"``, ``"openai:gpt-4.1"``, ``"local"``): resolved
  once, shared by every attempt, closed when the run ends;
- ``"scripted:package.module:attr"``: the object at that import path, read as below (or an
  ``EvalModel`` made with ``scripted(...)``, kept with its ``concurrency``);
- a ``Model``: shared as is (never closed: the caller owns it);
- scripts: a mapping from eval name to a script (a list of ``ScriptedModel`` steps), one
  script for every attempt, or a function ``f()``, ``f(eval_name)`` or
  ``f(eval_name, attempt)`` returning a ``Model`` or a script: each attempt gets a fresh
  ``ScriptedModel``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

from ..llm.errors import ConfigurationError
from ..llm.events import StreamEvent, UsageUpdate
from ..llm.model import Model
from ..llm.scripted import ScriptedModel
from ..llm.types import Request, Response, Usage

__all__ = ["EvalModel", "ModelLike", "eval_model", "scripted", "serves_at_once"]

SCRIPTED_PREFIX = "scripted:"


@dataclass(frozen=True)
class EvalModel:
    """A model under test: ``label`` names it in reports; ``build(eval_name, attempt)`` gives
    the ``Model`` one attempt runs on; ``close`` (if any) runs once, when the run ends;
    ``concurrency`` (if any) is how many of its attempts may run at once, whatever the
    run's own limit (``serves_at_once``: the local model, 1)."""

    label: str
    factory: Callable[[str, int], Model]
    close: Callable[[], Any] | None = None
    concurrency: int | None = None

    def build(self, eval_name: str, attempt: int) -> Model:
        model = self.factory(eval_name, attempt)
        if not isinstance(model, Model):
            raise ConfigurationError(
                f"model {self.label!r} gave a {type(model).__name__} for eval {eval_name!r}, "
                "not a runtime.llm Model")
        return model


ModelLike: TypeAlias = (
    "str | Model | EvalModel | Mapping[str, Any] | Sequence[Any] | Callable[..., Any]")
"""What ``Evaluator.run(models=[...])`` accepts for one model (see the module docstring)."""


def eval_model(spec: ModelLike) -> EvalModel:
    """``spec`` as an ``EvalModel``; a name is resolved now, so a missing key or an unknown
    model is a ``ConfigurationError`` before any attempt starts."""
    if isinstance(spec, EvalModel):
        return spec
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith(SCRIPTED_PREFIX):
            path = text[len(SCRIPTED_PREFIX):].strip()
            found = _import(path, text)
            if isinstance(found, EvalModel):  # made with scripted(...): its limit kept
                return replace(found, label=text)
            return scripted(found, label=text)
        from ..llm.resolve import resolve_model

        model = resolve_model(text or None)
        return EvalModel(f"{model.provider}:{model.name}", lambda _e, _a: model,
                         close=getattr(model, "aclose", None),
                         concurrency=serves_at_once(model))
    if isinstance(spec, Model):
        return EvalModel(f"{spec.provider}:{spec.name}", lambda _e, _a: spec,
                         concurrency=serves_at_once(spec))
    return scripted(spec)


def serves_at_once(model: Model) -> int | None:
    """How many requests ``model`` serves at once, when it is known: its ``concurrency``
    attribute if it has one (``LocalModel`` says 1: one loaded model decodes one sequence at
    a time; other requests wait for its lock), else 1 for another model of the ``local``
    provider (one that does not say), else None (no limit of its own: a provider's API).
    The evaluator runs no more of its attempts at once, so an attempt never waits inside the
    model for another's turn: that wait is queue time, kept apart from the attempt's own."""
    n = getattr(model, "concurrency", None)
    if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
        return n
    return 1 if model.provider == "local" else None


def scripted(scripts: Mapping[str, Any] | Sequence[Any] | Callable[..., Any], *,
             label: str = "scripted", concurrency: int | None = None) -> EvalModel:
    """A fresh ``ScriptedModel`` per attempt, from a mapping eval name -> script, one script
    for every eval, or a factory (``f()``, ``f(eval_name)`` or ``f(eval_name, attempt)``)
    returning a ``Model`` or a script. ``concurrency``: how many of its attempts may run at
    once (as for a model serving one request at a time, like the local model)."""
    if concurrency is not None and (isinstance(concurrency, bool)
                                    or not isinstance(concurrency, int) or concurrency < 1):
        raise ValueError(f"concurrency must be a positive whole number, got {concurrency!r}")
    return replace(_scripted(scripts, label), concurrency=concurrency)


def _scripted(scripts: Mapping[str, Any] | Sequence[Any] | Callable[..., Any],
              label: str) -> EvalModel:
    if isinstance(scripts, Model):
        return EvalModel(label, lambda _e, _a: scripts)
    if isinstance(scripts, Mapping):
        table = dict(scripts)

        def from_table(eval_name: str, attempt: int) -> Model:
            if eval_name not in table:
                have = ", ".join(sorted(map(str, table))) or "none"
                raise ConfigurationError(
                    f"the scripts {label!r} have no script for eval {eval_name!r} (they have: "
                    f"{have}): add one, or run only the evals they script")
            return _as_model(table[eval_name], label, eval_name, attempt)

        return EvalModel(label, from_table)
    if isinstance(scripts, Sequence) and not isinstance(scripts, str | bytes):
        steps = list(scripts)
        return EvalModel(label, lambda _e, _a: ScriptedModel(steps, name=label))
    if callable(scripts):
        arity = _arity(scripts)
        if label == "scripted":
            label = getattr(scripts, "__qualname__", label)

        def from_factory(eval_name: str, attempt: int) -> Model:
            made = scripts(*(eval_name, attempt)[:arity])
            return _as_model(made, label, eval_name, attempt)

        return EvalModel(label, from_factory)
    raise ConfigurationError(
        f"cannot run evals on a {type(scripts).__name__}: give a model name ('sonnet', "
        "'local'), a runtime.llm Model, 'scripted:package.module:attr', a mapping from eval "
        "name to a script, or a function returning a Model or a script")


def _as_model(made: Any, label: str, eval_name: str, attempt: int) -> Model:
    if isinstance(made, Model):
        return made
    if isinstance(made, Sequence) and not isinstance(made, str | bytes):
        return ScriptedModel(list(made), name=label)
    raise ConfigurationError(
        f"the scripts {label!r} gave a {type(made).__name__} for eval {eval_name!r} "
        f"(attempt {attempt}): a script is a list of ScriptedModel steps, or a Model")


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return min(len(positional), 2)


def _import(path: str, spec: str) -> Any:
    import importlib
    import sys

    module, sep, attr = path.rpartition(":")
    if not sep or not module or not attr:
        raise ConfigurationError(
            f"model {spec!r}: write scripted:package.module:attr (the scripts' import path)")
    if "" not in sys.path:
        sys.path.insert(0, "")  # a module of the directory the user stands in
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except ImportError as e:
        raise ConfigurationError(
            f"model {spec!r}: cannot import {module!r} ({e}); run from the directory that "
            "holds it, or put it on PYTHONPATH") from None
    except AttributeError:
        raise ConfigurationError(f"model {spec!r}: {module!r} has no {attr!r}") from None
    return obj


class Meter:
    """A ``Model`` wrapper counting one attempt's model calls and their tokens, however the
    attempt ends (a failed or cancelled call counts as a call; its tokens as far as the
    provider reported them)."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._usages: list[Usage] = []

    @property
    def name(self) -> str:
        return self._model.name

    @property
    def provider(self) -> str:
        return self._model.provider

    @property
    def calls(self) -> int:
        """The model calls made (the attempt's turns)."""
        return len(self._usages)

    @property
    def usage(self) -> Usage:
        """The tokens of every call, summed."""
        total = Usage()
        for u in self._usages:
            total = total + u
        return total

    async def generate(self, request: Request) -> Response:
        slot = len(self._usages)
        self._usages.append(Usage())
        response = await self._model.generate(request)
        self._usages[slot] = response.usage
        return response

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        slot = len(self._usages)
        self._usages.append(Usage())
        async for event in self._model.stream(request):
            if isinstance(event, UsageUpdate):  # a later update replaces an earlier one
                self._usages[slot] = event.usage
            yield event

    def __repr__(self) -> str:
        return f"Meter({self._model!r}, calls={self.calls})"
