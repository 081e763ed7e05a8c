"""Reports: the CSV round trip, merged rows, refused files, Markdown, the rich table, and the
before/after comparison (regressions first)."""

from __future__ import annotations

import io

import anyio
import pytest
from rich.console import Console

from runtime.evals import (
    CSV_COLUMNS,
    EvalResult,
    Evaluator,
    Failure,
    Report,
    ReportError,
    compare,
    evaluation,
    read_csv,
    scripted,
)
from runtime.llm import Reply, Usage


@evaluation(prompt="Say hello.")
def says_hello(llm) -> None:
    if "hello" not in (llm.last_reply or "").lower():  # (pytest would rewrite an assert)
        raise AssertionError("did not say hello")


def _report() -> Report:
    good = [Reply(text="hello, world", usage=Usage(input_tokens=11, output_tokens=3,
                                                   cache_read_tokens=5, cache_write_tokens=2))]
    odd = scripted(lambda _e, n: ["goodbye,\n\"friend\""] if n % 2 else good, label="odd, model")
    return anyio.run(lambda: Evaluator().with_evals([says_hello]).run(
        [scripted(good, label="good"), odd], attempts=3))


def test_the_csv_round_trip_is_exact(tmp_path) -> None:
    report = _report()
    path = tmp_path / "run.csv"
    report.write_csv(path)
    back = read_csv(path)
    assert back == tuple(r.summary() for r in report.results)
    assert back[1].failures == (Failure(1, "check: did not say hello"),
                                Failure(3, "check: did not say hello"))
    assert back[1].model == "odd, model" and back[0].seconds == report.results[0].seconds
    assert read_csv(io.StringIO(report.to_csv())) == back
    assert path.read_text().splitlines()[0] == ",".join(CSV_COLUMNS)


def test_rows_of_appended_runs_are_merged(tmp_path) -> None:
    a = EvalResult("m", "e", 2, 1, 10, 2, 0, 0, 3, 0.5, (Failure(2, "check: no"),))
    b = EvalResult("m", "e", 3, 3, 15, 3, 1, 1, 4, 0.25)
    text = Report((a,)).to_csv() + Report((b,)).to_csv().split("\n", 1)[1]
    (tmp_path / "both.csv").write_text(text)
    assert read_csv(tmp_path / "both.csv") == (
        EvalResult("m", "e", 5, 4, 25, 5, 1, 1, 7, 0.75, (Failure(2, "check: no"),)),)


def test_a_file_that_is_not_a_report_is_refused_by_row_and_column(tmp_path) -> None:
    with pytest.raises(ReportError, match="lacks the column"):
        read_csv(io.StringIO("model,eval\nm,e\n"), name="x.csv")
    bad = Report((EvalResult("m", "e", 2, 1),)).to_csv().replace(",2,1,", ",2,three,", 1)
    with pytest.raises(ReportError, match=r"row 2, column 'successes': not a whole number"):
        read_csv(io.StringIO(bad))
    more = Report((EvalResult("m", "e", 2, 1),)).to_csv().replace(",2,1,", ",2,5,", 1)
    with pytest.raises(ReportError, match="more successes than attempts"):
        read_csv(io.StringIO(more))
    with pytest.raises(ReportError, match="cannot read the eval report"):
        read_csv(tmp_path / "missing.csv")


def test_markdown_has_the_table_the_verdict_and_grouped_failures() -> None:
    text = _report().to_markdown()
    assert "**failed: 1 of 2 model x evals below 80%**" in text
    assert "| good | says_hello | 100% | 3 | 11 | 3 | 5 | 2 | 1 |" in text
    assert "| odd, model | says_hello | 33% | 3 |" in text and "**FAIL**" in text
    assert "### odd, model x says_hello: 2 of 3 attempts failed" in text
    assert "Attempts 1, 3:" in text and "`check: did not say hello`" in text
    assert 'Assistant: goodbye,\n"friend"' in text  # the transcript, fenced
    assert "transcript" not in _report().to_markdown(transcripts=False)


def test_the_terminal_table_renders() -> None:
    console = Console(record=True, width=160)
    console.print(_report().rich_table())
    out = console.export_text()
    assert "says_hello" in out and "100%" in out and "33%" in out and "FAIL" in out


def _r(model: str, eval: str, successes: int, attempts: int = 4, tokens: int = 100) -> EvalResult:
    return EvalResult(model, eval, attempts, successes, tokens * attempts, 10 * attempts,
                      turns=2 * attempts, seconds=attempts * 1.0)


def test_the_comparison_puts_regressions_first() -> None:
    before = [_r("a", "x", 4), _r("a", "y", 4), _r("a", "z", 2), _r("b", "x", 3),
              _r("a", "gone", 4)]
    after = [_r("a", "x", 4, tokens=80), _r("a", "y", 3), _r("a", "z", 4), _r("b", "x", 1),
             _r("a", "new", 1)]
    c = compare(before, after)
    assert [(ch.status, ch.model, ch.eval) for ch in c.changes] == [
        ("regressed", "b", "x"), ("regressed", "a", "y"), ("removed", "a", "gone"),
        ("new", "a", "new"), ("improved", "a", "z"), ("unchanged", "a", "x")]
    assert c.changes[0].success_delta == -0.5
    assert c.changes[-1].delta("input_tokens") == -20 and c.changes[-1].delta("turns") == 0
    assert [ch.eval for ch in c.regressions] == ["x", "y"]
    text = c.to_markdown()
    assert text.index("| regressed | b | x |") < text.index("| improved |")
    assert "75% -> 25% (-50 pts)" in text and "100 -> 80 (-20)" in text
    console = Console(record=True, width=160)
    console.print(c.rich_table())
    assert "regressed" in console.export_text()


def test_comparing_two_csv_files(tmp_path) -> None:
    Report((_r("a", "x", 4),)).write_csv(tmp_path / "old.csv")
    Report((_r("a", "x", 2),)).write_csv(tmp_path / "new.csv")
    c = compare(tmp_path / "old.csv", tmp_path / "new.csv")
    assert [(ch.status, ch.success_delta) for ch in c.changes] == [("regressed", -0.5)]
