"""What an evaluation found, per model x eval, and the ways to show, keep and compare it.

``Report.results`` holds one ``EvalResult`` per model x eval: attempts, successes (so the
success rate), token sums (input, output, cache read, cache write), turns (model calls),
wall time and queue time (summed over attempts: an attempt's own time, from when it got its
slots, and its wait for them), and each failed attempt's message and transcript. The
threshold (default 0.8) decides ``passed`` and ``exit_status``.

Shown as a terminal table (``rich_table``) or Markdown (``to_markdown``, failures and their
transcripts included); kept as CSV (``to_csv`` / ``read_csv``: every number exactly, the
failure messages but not the transcripts, which are for reading, not for spreadsheets);
compared with ``compare(before, after)``: deltas per model x eval, regressions first. Rows
of one model x eval repeated in a CSV (runs appended to one file) are merged when read; a
CSV written before queue time was kept (no ``queue_seconds`` column) reads as no queueing.
Token, turn and time columns in tables are means per attempt, so runs with different
attempt counts compare; the CSV keeps the sums.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CelldialogError

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_THRESHOLD",
    "Attempt",
    "Change",
    "Comparison",
    "EvalResult",
    "Failure",
    "Report",
    "ReportError",
    "compare",
    "read_csv",
]

DEFAULT_THRESHOLD = 0.8
CSV_COLUMNS = ("model", "eval", "attempts", "successes", "success_rate", "input_tokens",
               "output_tokens", "cache_read_tokens", "cache_write_tokens", "turns",
               "wall_seconds", "queue_seconds", "failures")
_OPTIONAL = ("success_rate", "queue_seconds")  # derived, or absent from older reports
_INTS = ("attempts", "successes", "input_tokens", "output_tokens", "cache_read_tokens",
         "cache_write_tokens", "turns")


class ReportError(CelldialogError, ValueError):
    """A CSV that is not an eval report (the message names the file, row and column)."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of one eval on one model."""

    model: str
    eval: str
    number: int
    passed: bool
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    turns: int = 0
    seconds: float = 0.0  # its own time: from when it got its slots to its end
    message: str = ""  # why it failed ("check: ..."), empty when it passed
    transcript: str = ""
    queue_seconds: float = 0.0  # how long it waited for a slot before it started


@dataclass(frozen=True)
class Failure:
    """A failed attempt: its number, why, and the conversation it had (empty when read
    from a CSV)."""

    attempt: int
    message: str
    transcript: str = ""


@dataclass(frozen=True)
class EvalResult:
    """One model x eval over all its attempts."""

    model: str
    eval: str
    attempts: int = 0
    successes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    turns: int = 0
    seconds: float = 0.0
    failures: tuple[Failure, ...] = ()
    queue_seconds: float = 0.0

    @property
    def success_rate(self) -> float:
        """Successes over attempts (0 for no attempts)."""
        return self.successes / self.attempts if self.attempts else 0.0

    def passed(self, threshold: float = DEFAULT_THRESHOLD) -> bool:
        """Whether the success rate reaches ``threshold``."""
        return self.attempts > 0 and self.successes >= threshold * self.attempts - 1e-9

    def per_attempt(self, name: str) -> float:
        """The mean of a summed column (``input_tokens``, ``turns``, ``seconds``...)."""
        return getattr(self, name) / self.attempts if self.attempts else 0.0

    def summary(self) -> EvalResult:
        """This result as a CSV keeps it: the failures' transcripts dropped."""
        return replace(self, failures=tuple(Failure(f.attempt, f.message)
                                            for f in self.failures))

    @classmethod
    def of(cls, attempts: Sequence[Attempt]) -> EvalResult:
        """The result of one model x eval's attempts (at least one)."""
        first = attempts[0]
        ordered = sorted(attempts, key=lambda a: a.number)
        return cls(
            first.model, first.eval, len(ordered), sum(a.passed for a in ordered),
            sum(a.input_tokens for a in ordered), sum(a.output_tokens for a in ordered),
            sum(a.cache_read_tokens for a in ordered), sum(a.cache_write_tokens for a in ordered),
            sum(a.turns for a in ordered), sum(a.seconds for a in ordered),
            tuple(Failure(a.number, a.message, a.transcript) for a in ordered if not a.passed),
            sum(a.queue_seconds for a in ordered))

    def merged(self, other: EvalResult) -> EvalResult:
        """Two runs of one model x eval as one (attempts renumbered after this one's)."""
        return EvalResult(
            self.model, self.eval, self.attempts + other.attempts,
            self.successes + other.successes, self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens, self.turns + other.turns,
            self.seconds + other.seconds,
            self.failures + tuple(replace(f, attempt=f.attempt + self.attempts)
                                  for f in other.failures),
            self.queue_seconds + other.queue_seconds)


@dataclass(frozen=True)
class Report:
    """The results of one ``Evaluator.run``: per model x eval, in the order of the models,
    then of the evals; ``seconds`` is the run's wall time; ``attempts`` every attempt, in the
    order they ended."""

    results: tuple[EvalResult, ...]
    threshold: float = DEFAULT_THRESHOLD
    seconds: float = 0.0
    attempts: tuple[Attempt, ...] = field(default=(), repr=False)

    @property
    def passed(self) -> bool:
        """Every model x eval reached the threshold."""
        return bool(self.results) and all(r.passed(self.threshold) for r in self.results)

    @property
    def failing(self) -> tuple[EvalResult, ...]:
        """The model x evals below the threshold."""
        return tuple(r for r in self.results if not r.passed(self.threshold))

    @property
    def exit_status(self) -> int:
        """0 when every model x eval reached the threshold, else 1."""
        return 0 if self.passed else 1

    def result(self, model: str, eval: str) -> EvalResult:
        """The result of ``eval`` on ``model`` (a ``KeyError`` naming what exists)."""
        for r in self.results:
            if r.model == model and r.eval == eval:
                return r
        have = ", ".join(f"{r.model} x {r.eval}" for r in self.results) or "none"
        raise KeyError(f"no result for {model} x {eval}; the report has: {have}")

    # -- showing ---------------------------------------------------------------------

    def verdict(self) -> str:
        """One line: passed, or how many model x evals fell below the threshold."""
        if self.passed:
            return (f"passed: every model x eval reached {self.threshold:.0%} "
                    f"({len(self.results)} checked in {self.seconds:.1f} s)")
        if not self.results:
            return "failed: nothing was evaluated"
        return (f"failed: {len(self.failing)} of {len(self.results)} model x evals below "
                f"{self.threshold:.0%}")

    def to_markdown(self, transcripts: bool = True) -> str:
        """The report as Markdown: the table, the verdict, then each failure (with its
        transcript in a collapsed block, unless ``transcripts`` is false)."""
        lines = ["# Eval report", "", f"**{self.verdict()}**", "",
                 "| model | eval | success | attempts | input | output | cache read | "
                 "cache write | turns | wall (s) | queue (s) | |",
                 "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
        for r in self.results:
            ok = "pass" if r.passed(self.threshold) else "**FAIL**"
            lines.append(
                f"| {_md(r.model)} | {_md(r.eval)} | {r.success_rate:.0%} | {r.attempts} | "
                + " | ".join(_num(r.per_attempt(c)) for c in _MEANS) + f" | {ok} |")
        lines += ["", "Tokens, turns (model calls), wall time (an attempt's own) and queue time "
                  "(its wait for a free slot) are means per attempt."]
        failed = [r for r in self.results if r.failures]
        if failed:
            lines += ["", "## Failures"]
        for r in failed:
            lines += ["", f"### {_md(r.model)} x {_md(r.eval)}: {len(r.failures)} of "
                      f"{r.attempts} attempts failed"]
            by_message: dict[str, list[Failure]] = {}
            for f in r.failures:
                by_message.setdefault(f.message, []).append(f)
            for message, group in by_message.items():
                numbers = ", ".join(str(f.attempt) for f in group)
                lines += ["", f"Attempt{'s' if len(group) > 1 else ''} {numbers}:", "",
                          _md_text(message)]
                shown = next((f.transcript for f in group if f.transcript), "")
                if transcripts and shown:
                    lines += ["", f"<details><summary>transcript (attempt {group[0].attempt})"
                              "</summary>", "", _fence(shown), "", "</details>"]
        return "\n".join(lines) + "\n"

    def rich_table(self) -> Table:
        """The report as a ``rich`` table, for a terminal."""
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="Evals", title_justify="left",
                      caption="means per attempt: tokens, turns (model calls), wall time "
                      "(the attempt's own) and queue time (its wait for a slot)",
                      caption_justify="left")
        table.add_column("model", no_wrap=True)
        table.add_column("eval", no_wrap=True)
        for col in ("success", "attempts", "input", "output", "cache read", "cache write",
                    "turns", "wall (s)", "queue (s)"):
            table.add_column(col, justify="right")
        table.add_column("")
        for r in self.results:
            ok = r.passed(self.threshold)
            rate = f"[{'green' if ok else 'red'}]{r.success_rate:.0%}[/]"
            table.add_row(escape(r.model), escape(r.eval), rate,
                          str(r.attempts), *(_num(r.per_attempt(c)) for c in _MEANS),
                          "[green]pass[/]" if ok else "[bold red]FAIL[/]")
        return table

    # -- keeping -----------------------------------------------------------------------

    def to_csv(self) -> str:
        """The results as CSV (``CSV_COLUMNS``); ``read_csv`` reads them back exactly
        (transcripts aside)."""
        return results_csv(self.results)

    def write_csv(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_csv()`` to ``path``."""
        Path(path).write_text(self.to_csv(), encoding="utf-8", newline="")


def results_csv(results: Iterable[EvalResult]) -> str:
    """Results as CSV text (see ``Report.to_csv``)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in results:
        failures = json.dumps([[f.attempt, f.message] for f in r.failures], ensure_ascii=False)
        writer.writerow([r.model, r.eval, r.attempts, r.successes, f"{r.success_rate:.4f}",
                         r.input_tokens, r.output_tokens, r.cache_read_tokens,
                         r.cache_write_tokens, r.turns, repr(float(r.seconds)),
                         repr(float(r.queue_seconds)), failures])
    return buf.getvalue()


def read_csv(source: str | os.PathLike[str] | io.TextIOBase, *,
             name: str | None = None) -> tuple[EvalResult, ...]:
    """The results in a CSV written by ``Report.to_csv`` (a path, or an open text file);
    rows repeating a model x eval are merged. A file that is not one is a ``ReportError``
    naming the row and column."""
    if isinstance(source, str | os.PathLike):
        where = name or str(source)
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as e:
            raise ReportError(f"cannot read the eval report {where!r}: "
                              f"{e.strerror or e}") from None
    else:
        where = name or getattr(source, "name", "the CSV")
        text = source.read()
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in CSV_COLUMNS
               if c not in _OPTIONAL and c not in (reader.fieldnames or ())]
    if missing:
        raise ReportError(
            f"{where} is not an eval report CSV: it lacks the column(s) {', '.join(missing)} "
            f"(a report has {', '.join(CSV_COLUMNS)}; write one with celldialog eval --csv)")
    merged: dict[tuple[str, str], EvalResult] = {}
    for line, row in enumerate(reader, 2):
        result = _row(row, where, line)
        key = (result.model, result.eval)
        merged[key] = merged[key].merged(result) if key in merged else result
    return tuple(merged.values())


def _row(row: dict[str, Any], where: str, line: int) -> EvalResult:
    def bad(column: str, why: str) -> ReportError:
        return ReportError(f"{where}, row {line}, column {column!r}: {why} "
                           f"(got {row.get(column)!r})")

    values: dict[str, Any] = {}
    for col in _INTS:
        try:
            values[col] = int(row[col])
        except (TypeError, ValueError):
            raise bad(col, "not a whole number") from None
        if values[col] < 0:
            raise bad(col, "negative")
    if values["successes"] > values["attempts"]:
        raise bad("successes", "more successes than attempts")
    times = {}
    for col in ("wall_seconds", "queue_seconds"):
        try:
            times[col] = float(row.get(col) or 0) if col == "queue_seconds" else float(row[col])
        except (TypeError, ValueError):
            raise bad(col, "not a number") from None
        if times[col] < 0:
            raise bad(col, "negative")
    try:
        failures = tuple(Failure(int(n), str(m)) for n, m in json.loads(row["failures"] or "[]"))
    except (TypeError, ValueError):
        raise bad("failures", "not a JSON list of [attempt, message]") from None
    if not row["model"] or not row["eval"]:
        raise bad("model" if not row["model"] else "eval", "empty")
    return EvalResult(row["model"], row["eval"], seconds=times["wall_seconds"],
                      queue_seconds=times["queue_seconds"], failures=failures, **values)


# -- comparing ------------------------------------------------------------------------

_ORDER = {"regressed": 0, "removed": 1, "new": 2, "improved": 3, "unchanged": 4}


@dataclass(frozen=True)
class Change:
    """One model x eval before and after (either may be None: new, or removed)."""

    model: str
    eval: str
    before: EvalResult | None
    after: EvalResult | None

    @property
    def status(self) -> str:
        """``regressed``, ``improved`` or ``unchanged`` (by success rate), ``new``,
        ``removed``."""
        if self.before is None:
            return "new"
        if self.after is None:
            return "removed"
        d = self.success_delta
        return "regressed" if d < -1e-9 else "improved" if d > 1e-9 else "unchanged"

    @property
    def success_delta(self) -> float:
        """After's success rate minus before's (0 when one side is missing)."""
        if self.before is None or self.after is None:
            return 0.0
        return self.after.success_rate - self.before.success_rate

    def delta(self, column: str) -> float | None:
        """After's mean per attempt minus before's, for a summed column; None when one
        side is missing."""
        if self.before is None or self.after is None:
            return None
        return self.after.per_attempt(column) - self.before.per_attempt(column)


@dataclass(frozen=True)
class Comparison:
    """Before and after, per model x eval: regressions first (the largest drop first),
    then removed, new, improved (the largest gain first), unchanged."""

    changes: tuple[Change, ...]

    @property
    def regressions(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.status == "regressed")

    def to_markdown(self) -> str:
        """The comparison as a Markdown table."""
        lines = ["# Eval comparison", "",
                 f"{len(self.regressions)} regressed, "
                 f"{sum(c.status == 'improved' for c in self.changes)} improved, "
                 f"{sum(c.status == 'unchanged' for c in self.changes)} unchanged, "
                 f"{sum(c.status == 'new' for c in self.changes)} new, "
                 f"{sum(c.status == 'removed' for c in self.changes)} removed.", "",
                 "| | model | eval | success | input | output | turns | wall (s) |",
                 "|---|---|---|--:|--:|--:|--:|--:|"]
        for c in self.changes:
            lines.append(f"| {c.status} | {_md(c.model)} | {_md(c.eval)} | "
                         + " | ".join(_cells(c)) + " |")
        lines += ["", "Tokens, turns and wall time: means per attempt, before -> after (delta)."]
        return "\n".join(lines) + "\n"

    def rich_table(self) -> Table:
        """The comparison as a ``rich`` table."""
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="Before -> after", title_justify="left",
                      caption="tokens, turns and wall time: means per attempt",
                      caption_justify="left")
        for col in ("", "model", "eval"):
            table.add_column(col)
        for col in ("success", "input", "output", "turns", "wall (s)"):
            table.add_column(col, justify="right")
        colour = {"regressed": "bold red", "improved": "green", "new": "cyan",
                  "removed": "yellow", "unchanged": "dim"}
        for c in self.changes:
            table.add_row(f"[{colour[c.status]}]{c.status}[/]", escape(c.model), escape(c.eval),
                          *_cells(c))
        return table


def compare(before: Report | Iterable[EvalResult] | str | os.PathLike[str],
            after: Report | Iterable[EvalResult] | str | os.PathLike[str]) -> Comparison:
    """Compare two runs (reports, results, or CSV paths), per model x eval."""
    old, new = _results(before), _results(after)
    old_map = {(r.model, r.eval): r for r in old}
    new_map = {(r.model, r.eval): r for r in new}
    keys = list(new_map) + [k for k in old_map if k not in new_map]
    changes = [Change(m, e, old_map.get((m, e)), new_map.get((m, e))) for m, e in keys]
    changes.sort(key=lambda c: (_ORDER[c.status],
                                c.success_delta if c.status == "regressed" else -c.success_delta,
                                c.model, c.eval))
    return Comparison(tuple(changes))


def _results(x: Report | Iterable[EvalResult] | str | os.PathLike[str]) -> tuple[EvalResult, ...]:
    if isinstance(x, Report):
        return x.results
    if isinstance(x, str | os.PathLike):
        return read_csv(x)
    return tuple(x)


_MEANS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "turns",
          "seconds", "queue_seconds")


def _cells(c: Change) -> list[str]:
    b, a = c.before, c.after
    if b is None or a is None:
        r = a or b
        assert r is not None
        return [f"{r.success_rate:.0%}", *(_num(r.per_attempt(col)) for col in
                                          ("input_tokens", "output_tokens", "turns", "seconds"))]
    out = [f"{b.success_rate:.0%} -> {a.success_rate:.0%} ({c.success_delta * 100:+.0f} pts)"]
    for col in ("input_tokens", "output_tokens", "turns", "seconds"):
        d = c.delta(col) or 0.0
        out.append(f"{_num(b.per_attempt(col))} -> {_num(a.per_attempt(col))} ({_signed(d)})")
    return out


def _num(x: float) -> str:
    if x == int(x):
        return f"{int(x):,}"
    return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + _num(x) if x else "0"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_text(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) if "\n" in text else \
        f"`{text}`" if "`" not in text else text


def _fence(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"
