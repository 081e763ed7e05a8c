"""``celldialog eval EVALS``: run evals across models, with a progress bar, then a table.

EVALS is a directory, a file (``evals.py``, ``evals.py:name``) or ``module[:name]``
(``runtime.evals.loading``). ``--models`` takes names ``resolve_model`` knows (``sonnet``,
``openai:gpt-4.1``, ``local``) and ``scripted:package.module:attr`` (scripts by import
path, for offline runs), comma-separated or repeated; without it, the default model
(``celldialog models`` says which). Every model is resolved before anything runs, so a
missing key is one line, not a column of failures.

The progress bar goes to stderr and the table to stdout; ``--csv`` and ``--markdown`` write
the report, ``--compare old.csv`` shows the deltas against an earlier run (regressions
first). Exit status: 0 when every model x eval reached ``--threshold``, 1 when one did not,
and the documented statuses of ``errors.py`` for what stopped the run (2 bad arguments, 4 a
model's configuration). Registered in ``COMMANDS`` as ``command``; ``eval_command`` is the
same object.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .errors import EXIT_FAILURE, EXIT_OK, EXIT_PATTERN, EXIT_USAGE, CliError, report

if TYPE_CHECKING:
    from ..evals import Attempt, Report

__all__ = ["command", "eval_command"]


def _split(values: tuple[str, ...]) -> list[str]:
    return [part.strip() for v in values for part in v.split(",") if part.strip()]


@click.command(name="eval")
@click.argument("evals")
@click.option("--models", "models", multiple=True, metavar="A,B",
              help="Models to evaluate, comma-separated or repeated (default: the default "
                   "model). scripted:package.module:attr names scripts by import path.")
@click.option("--attempts", type=click.IntRange(min=1), default=1, show_default=True,
              help="Attempts per model x eval.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None, metavar="N",
              help="Attempts running at once (default 8).")
@click.option("--threshold", type=click.FloatRange(0, 1), default=0.8, show_default=True,
              help="Success rate each model x eval must reach for exit status 0.")
@click.option("--only", "only", multiple=True, metavar="NAME,...",
              help="Run only these evals (comma-separated or repeated).")
@click.option("--system-prompt", "system_prompt", type=click.Path(dir_okay=False, exists=True),
              default=None, help="A file whose text is added to every eval's system prompt.")
@click.option("--docs", "docs", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A file of documentation given to every eval (in its system prompt).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="Fail an attempt that takes longer.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Write the results as CSV (keep it to --compare later runs with).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), default=None,
              help="Write the report as Markdown, failures and transcripts included.")
@click.option("--compare", "compare_path", type=click.Path(dir_okay=False), default=None,
              help="A CSV of an earlier run: show the deltas, regressions first.")
@click.pass_context
def eval_command(ctx: click.Context, evals: str, models: tuple[str, ...], attempts: int,
                 concurrency: int | None, threshold: float, only: tuple[str, ...],
                 system_prompt: str | None, docs: str | None, timeout: float | None,
                 csv_path: str | None, markdown_path: str | None,
                 compare_path: str | None) -> None:
    """Run the evals in EVALS (a directory, a file, or module[:name]) on each model,
    --attempts times each, in parallel; print success rates, tokens, turns and wall time.
    Exits 1 when a model x eval is below --threshold."""
    try:
        status = _run(evals, _split(models), attempts, concurrency, threshold, _split(only),
                      system_prompt, docs, timeout, csv_path, markdown_path, compare_path)
    except (Exception, KeyboardInterrupt) as e:
        status = report(e, "eval")
    ctx.exit(status)


command = eval_command


def _run(evals_spec: str, model_specs: list[str], attempts: int, concurrency: int | None,
         threshold: float, only: list[str], system_prompt: str | None, docs: str | None,
         timeout: float | None, csv_path: str | None, markdown_path: str | None,
         compare_path: str | None) -> int:
    import anyio

    from ..evals import EvalLoadError, Evaluator, ReportError, compare, eval_model, load_evals
    from ..evals import read_csv as read_report

    try:
        found = load_evals(evals_spec)
    except EvalLoadError as e:
        raise CliError(f"EVALS: {e}", EXIT_USAGE if e.not_found else EXIT_PATTERN) from None
    try:
        evaluator = Evaluator(threshold=threshold, timeout=timeout).with_evals(found)
    except (TypeError, ValueError) as e:  # two evals of one name, say
        raise CliError(f"EVALS: {e}", EXIT_USAGE) from None
    if only:
        try:
            evaluator = evaluator.only(only)
        except KeyError as e:
            raise CliError(f"--only: {e.args[0]}", EXIT_USAGE) from None
    if system_prompt:
        evaluator = evaluator.with_system_prompt_file(system_prompt)
    if docs:
        evaluator = evaluator.with_docs_file(docs)
    before = None
    if compare_path is not None:
        try:
            before = read_report(compare_path)
        except ReportError as e:
            raise CliError(f"--compare: {e}", EXIT_USAGE) from None
    for path, flag in ((csv_path, "--csv"), (markdown_path, "--markdown")):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise CliError(f"{flag}: the directory of {path!r} does not exist", EXIT_USAGE)
    # resolved now: an unknown model or a missing key stops here, in one line (status 4)
    chosen = [eval_model(m) for m in model_specs] if model_specs else [eval_model("")]
    labels = [m.label for m in chosen]
    twice = next((x for x in labels if labels.count(x) > 1), None)
    if twice is not None:
        raise CliError(f"--models: {twice} is given twice (each model is one row per eval)",
                       EXIT_USAGE)

    result: Report = anyio.run(_with_progress, evaluator, chosen, attempts, concurrency)

    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False)
    if not out.is_terminal:  # a file or a pipe: wide enough that no column is cut
        out = Console(highlight=False, width=max(out.width, 160))
    out.print(result.rich_table())
    for r in result.results:
        for f in r.failures[:1]:
            n = len(r.failures) - 1
            more = f" (and {n} more failed attempt{'s' if n > 1 else ''})" if n else ""
            out.print(f"[red]x[/] {escape(r.model)} x {escape(r.eval)}, attempt {f.attempt}: "
                      f"{escape(_one_line(f.message))}{more}", soft_wrap=True)
    if before is not None:
        out.print(compare(before, result).rich_table())
    if csv_path is not None:
        result.write_csv(csv_path)
    if markdown_path is not None:
        text = result.to_markdown()
        if before is not None:
            text += "\n" + compare(before, result).to_markdown()
        Path(markdown_path).write_text(text, encoding="utf-8")
    colour = "green" if result.passed else "red"
    out.print(f"[{colour}]{result.verdict()}[/]", soft_wrap=True)
    return EXIT_OK if result.passed else EXIT_FAILURE


async def _with_progress(evaluator: Any, chosen: list[Any], attempts: int,
                         concurrency: int | None) -> Report:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = len(chosen) * len(evaluator.evals) * attempts
    failed = 0
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]evals[/]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                  console=console, transient=console.is_terminal) as progress:
        task = progress.add_task("evals", total=total, failed=0)

        def advance(attempt: Attempt) -> None:
            nonlocal failed
            failed += not attempt.passed
            progress.update(task, advance=1, failed=failed)

        return await evaluator.run(chosen, attempts, concurrency, on_attempt=advance)


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


if __name__ == "__main__":  # python -m runtime.cli.eval_cmd EVALS ...
    eval_command(prog_name="celldialog eval")
    sys.exit(EXIT_OK)
