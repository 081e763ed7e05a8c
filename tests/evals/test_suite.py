"""Our eval suite (evals/): every eval passes on its correct script and fails, for the reason
it is about, on its wrong one; the directory, a file, file:name and module forms load it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from runtime.evals import EvalLoadError, Evaluator, load_evals, scripted

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "evals"

WRONG_BECAUSE = {
    "own-tools-over-generic": "used the generic management tool(s) ['read'] instead of addItem",
    "handler-changes-state": "the list should hold milk and mum",
    "presents-result": "never called presentResult",
    "recovers-from-tool-error": "should have booked 20:00",
    "multi-step-tools": "never found the SKU",
}


def test_the_suite_covers_what_the_seeds_say_models_get_wrong() -> None:
    assert sorted(e.name for e in load_evals(SUITE)) == sorted(WRONG_BECAUSE)


def test_correct_scripts_pass_and_wrong_ones_fail_for_their_reason() -> None:
    from evals.scripts import correct, wrong

    report = anyio.run(lambda: Evaluator().with_evals(load_evals(SUITE)).run(
        [scripted(correct, label="correct"), scripted(wrong, label="wrong")], attempts=2))
    for r in report.results:
        if r.model == "correct":
            assert r.successes == 2, (r.eval, r.failures)
            assert r.turns > 0 and r.input_tokens > 0
        else:
            assert r.successes == 0, r.eval
            assert all(f.message.startswith("check: " + WRONG_BECAUSE[r.eval])
                       for f in r.failures), (r.eval, r.failures)
    assert report.failing == tuple(r for r in report.results if r.model == "wrong")


def test_the_forms_of_evals() -> None:
    assert [e.name for e in load_evals(f"{SUITE / 'dialogs.py'}:presents-result")] == [
        "presents-result"]
    assert [e.name for e in load_evals("evals.conversation")] == ["multi-step-tools"]
    assert [e.name for e in load_evals("evals.conversation:multi-step-tools")] == [
        "multi-step-tools"]


def test_what_cannot_be_loaded_says_why(tmp_path) -> None:
    with pytest.raises(EvalLoadError, match="no such file or directory"):
        load_evals(tmp_path / "nope.py")
    with pytest.raises(EvalLoadError, match="no eval named 'nope'; its evals: multi-step-tools"):
        load_evals("evals.conversation:nope")
    with pytest.raises(EvalLoadError, match="holds no Python files"):
        load_evals(tmp_path)
    (tmp_path / "empty_evals.py").write_text("x = 1\n")
    with pytest.raises(EvalLoadError, match="defines no evals"):
        load_evals(tmp_path / "empty_evals.py")
    (tmp_path / "broken_evals.py").write_text("import no_such_module_here\n")
    with pytest.raises(EvalLoadError, match=r"importing .* failed: ModuleNotFoundError"):
        load_evals(tmp_path / "broken_evals.py")
    with pytest.raises(EvalLoadError, match="no module named 'no_such_pkg'"):
        load_evals("no_such_pkg")


@pytest.mark.local
def test_the_suite_runs_on_the_local_model() -> None:
    """The embedded model is tiny: what is asserted is that it is measured (turns, tokens,
    wall time), not that it passes."""
    pytest.importorskip("llama_cpp", reason="pip install -e '.[local]'")
    evaluator = Evaluator(timeout=240).with_evals(load_evals(SUITE)).only(["presents-result"])
    report = anyio.run(lambda: evaluator.run(["local"], attempts=1))
    r = report.results[0]
    assert r.model.startswith("local:") and r.attempts == 1
    assert r.turns >= 1 and r.input_tokens > 0 and r.seconds > 0
