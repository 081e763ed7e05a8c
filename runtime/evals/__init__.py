"""Evals: measure how well models do what a prompt asks, across models, many attempts each.

An eval has a ``name``, a ``prompt(base: LLM) -> LLM`` and a ``check(llm)`` that raises on
failure (``Eval``, or ``@evaluation``); a pattern with an ``llm_dialog`` is one too
(``PatternEval``). The ``Evaluator`` runs models and attempts in parallel, each attempt on its
own fork, and reports per model x eval: success rate, tokens, turns (model calls), wall time,
and each failure with its transcript (``Report``: a terminal table, Markdown, CSV;
``compare`` for before/after). ``docs/evals.md`` is the guide.
"""

from __future__ import annotations

from .core import BaseEval, Eval, ToolCall, evaluation, tool_calls
from .eval_models import EvalModel, ModelLike, eval_model, scripted, serves_at_once
from .evaluator import DEFAULT_CONCURRENCY, Evaluator
from .loading import EvalLoadError, evals_in, load_evals
from .patterns import PatternEval, PatternRun
from .report import (
    CSV_COLUMNS,
    DEFAULT_THRESHOLD,
    Attempt,
    Change,
    Comparison,
    EvalResult,
    Failure,
    Report,
    ReportError,
    compare,
    read_csv,
)

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_THRESHOLD",
    "Attempt",
    "BaseEval",
    "Change",
    "Comparison",
    "Eval",
    "EvalLoadError",
    "EvalModel",
    "EvalResult",
    "Evaluator",
    "Failure",
    "ModelLike",
    "PatternEval",
    "PatternRun",
    "Report",
    "ReportError",
    "ToolCall",
    "compare",
    "eval_model",
    "evals_in",
    "evaluation",
    "load_evals",
    "read_csv",
    "scripted",
    "serves_at_once",
    "tool_calls",
]
