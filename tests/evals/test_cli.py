"""``celldialog eval``: through click's CliRunner and as a real process (the command object
run as a script), on the suite's scripts: exit statuses, CSV, Markdown, --compare, and one
clear line for each bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime.cli.eval_cmd import command, eval_command
from runtime.evals import read_csv

REPO = Path(__file__).resolve().parents[2]
SUITE = str(REPO / "evals")
CORRECT = "scripted:evals.scripts:correct"
WRONG = "scripted:evals.scripts:wrong"


@pytest.fixture(autouse=True)
def fresh_user(monkeypatch, tmp_path: Path) -> Path:
    """No keys, no model named, no .env: a directory of its own."""
    for var in list(os.environ):
        if var.startswith(("OPENAI_", "ANTHROPIC_", "CELLDIALOG_")):
            monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _invoke(*args: str):
    return CliRunner().invoke(eval_command, list(args), catch_exceptions=False)


def test_correct_scripts_exit_0_and_write_the_csv_and_markdown(tmp_path: Path) -> None:
    assert command is eval_command
    result = _invoke(SUITE, "--models", CORRECT, "--attempts", "3", "--concurrency", "4",
                     "--csv", "out.csv", "--markdown", "out.md")
    assert result.exit_code == 0, result.output + result.stderr
    assert "passed: every model x eval reached 80%" in result.stdout
    assert "multi-step-tools" in result.stdout and "100%" in result.stdout
    assert "evals" in result.stderr  # the progress bar
    rows = read_csv(tmp_path / "out.csv")
    assert len(rows) == 5 and all((r.attempts, r.successes) == (3, 3) for r in rows)
    assert (tmp_path / "out.md").read_text().startswith("# Eval report")


def test_a_model_below_the_threshold_exits_1_and_compare_shows_regressions(
        tmp_path: Path) -> None:
    assert _invoke(SUITE, "--models", CORRECT, "--csv", "before.csv").exit_code == 0
    result = _invoke(SUITE, "--models", WRONG, "--compare", "before.csv", "--markdown", "r.md",
                     "--only", "presents-result,multi-step-tools")
    assert result.exit_code == 1
    assert "failed: 2 of 2 model x evals below 80%" in result.stdout
    assert "never called presentResult" in result.stdout
    assert "Before -> after" in result.stdout and "removed" in result.stdout
    md = (tmp_path / "r.md").read_text()
    assert "# Eval comparison" in md and "| removed |" in md
    # the same models as before: regressions
    both = _invoke(SUITE, "--models", f"{CORRECT},{WRONG}", "--threshold", "0",
                   "--compare", "before.csv", "--markdown", "c.md")
    assert both.exit_code == 0  # a threshold of 0 passes anything
    assert "| new | scripted:evals.scripts:wrong |" in (tmp_path / "c.md").read_text()


def test_a_scripted_factory_named_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "factory_scripts.py").write_text(
        "from evals.scripts import correct, wrong\n\n"
        "def every_other(eval_name, attempt):\n"
        "    return (correct if attempt % 2 else wrong)[eval_name]\n")
    result = _invoke(SUITE, "--models", "scripted:factory_scripts:every_other",
                     "--attempts", "4", "--threshold", "0.5", "--csv", "f.csv")
    assert result.exit_code == 0, result.stderr
    assert "(and 1 more failed attempt)" in result.stdout
    rows = read_csv(tmp_path / "f.csv")
    assert [(r.successes, [f.attempt for f in r.failures]) for r in rows] == [(2, [2, 4])] * 5
    assert rows[0].model == "scripted:factory_scripts:every_other"
    assert _invoke(SUITE, "--models", "scripted:factory_scripts:every_other", "--attempts",
                   "4").exit_code == 1  # 50% is below the default 80%


def test_regressions_come_first(tmp_path: Path) -> None:
    # the scripts' label is the model: run the wrong scripts under the correct ones' name
    (tmp_path / "relabel.py").write_text(
        "from evals.scripts import correct, wrong\n"
        "now = {**correct, 'presents-result': wrong['presents-result']}\n")
    first = _invoke(SUITE, "--models", "scripted:relabel:correct", "--csv", "a.csv")
    assert first.exit_code == 0
    import csv

    rows = list(csv.DictReader((tmp_path / "a.csv").open()))
    for row in rows:
        row["model"] = "scripted:relabel:now"
    with (tmp_path / "a.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = _invoke(SUITE, "--models", "scripted:relabel:now", "--compare", "a.csv",
                     "--markdown", "m.md")
    assert result.exit_code == 1
    comparison = (tmp_path / "m.md").read_text().split("# Eval comparison")[1]
    lines = [x for x in comparison.splitlines() if x.startswith("| ")]
    statuses = [x.split("|")[1].strip() for x in lines[1:]]
    assert statuses == ["regressed"] + ["unchanged"] * 4
    assert "| regressed | scripted:relabel:now | presents-result | 100% -> 0% (-100 pts)" in \
        lines[1]


@pytest.mark.parametrize(("args", "status", "line"), [
    (["no/such/dir"], 2, "EVALS: no such file or directory 'no/such/dir'"),
    ([SUITE, "--models", "nope-model"], 4, "cannot tell the provider of model 'nope-model'"),
    ([SUITE, "--models", "sonnet"], 4, "no API key for anthropic: set ANTHROPIC_API_KEY"),
    ([SUITE, "--models", "scripted:evals.scripts:nothing"], 4, "has no 'nothing'"),
    ([SUITE, "--models", CORRECT, "--only", "nope"], 2, "--only: no eval named 'nope'"),
    ([SUITE, "--models", CORRECT, "--compare", "missing.csv"], 2,
     "--compare: cannot read the eval report 'missing.csv'"),
    ([SUITE, "--models", f"{CORRECT},{CORRECT}"], 2,
     "--models: scripted:evals.scripts:correct is given twice"),
    ([SUITE, "--models", CORRECT, "--csv", "no/dir/x.csv"], 2,
     "--csv: the directory of 'no/dir/x.csv' does not exist"),
])
def test_each_bad_input_is_one_line_and_its_status(args: list[str], status: int,
                                                   line: str) -> None:
    result = _invoke(*args)
    assert result.exit_code == status, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("celldialog eval: ") and line in err[0], err
    assert "Traceback" not in result.output


def test_two_evals_of_one_name_are_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "twice").mkdir()
    for stem in ("a_evals", "b_evals"):
        (tmp_path / "twice" / f"{stem}.py").write_text(
            "from runtime.evals import evaluation\n\n"
            "@evaluation('same', prompt='hi')\ndef same(llm):\n    pass\n")
    result = _invoke(str(tmp_path / "twice"), "--models", CORRECT)
    assert result.exit_code == 2
    assert "EVALS: two evals are named 'same'" in result.stderr


def test_bad_option_values_are_usage_errors() -> None:
    for args in (["--attempts", "0"], ["--threshold", "1.5"], ["--concurrency", "0"]):
        result = CliRunner().invoke(eval_command, [SUITE, *args])
        assert result.exit_code == 2, args


def _process(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "CELLDIALOG_"))}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200")
    code = "from runtime.cli.eval_cmd import eval_command; eval_command()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_as_a_process(tmp_path: Path) -> None:
    ok = _process([SUITE, "--models", CORRECT, "--attempts", "2", "--csv", "ok.csv"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert all(r.successes == 2 for r in read_csv(tmp_path / "ok.csv"))
    bad = _process([SUITE, "--models", f"{CORRECT},{WRONG}", "--compare", "ok.csv"], tmp_path)
    assert bad.returncode == 1 and "failed: 5 of 10 model x evals below 80%" in bad.stdout
    assert "Traceback" not in bad.stderr
    missing = _process([SUITE, "--models", "sonnet"], tmp_path)
    assert missing.returncode == 4
    assert missing.stderr.strip().splitlines()[-1].startswith(
        "celldialog eval: no API key for anthropic")
    assert "Traceback" not in missing.stderr


def test_through_the_celldialog_command(tmp_path: Path) -> None:
    """Registered in the group (runtime/cli/__init__.py): the exit status comes through."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "CELLDIALOG_"))}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200")

    def celldialog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runtime.cli", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    assert "eval" in celldialog("--help").stdout
    wrong = celldialog("eval", SUITE, "--models", WRONG, "--only", "presents-result")
    assert wrong.returncode == 1 and "never called presentResult" in wrong.stdout
    right = celldialog("eval", SUITE, "--models", CORRECT, "--markdown", "r.md")
    assert right.returncode == 0 and (tmp_path / "r.md").is_file()
    bad = celldialog("eval", SUITE, "--models", "nope-model")
    assert bad.returncode == 4 and bad.stderr.startswith("celldialog eval: cannot tell")


QUEUED_EVALS = '''
from runtime.evals import evaluation

@evaluation(prompt="Say hello.")
def says_something(llm):
    assert llm.last_reply, "should say something"
'''
QUEUED_MODELS = '''
from runtime.evals import scripted
from runtime.llm import delayed

# a model that serves one attempt at a time, as the local model does
lone = scripted(lambda: [delayed(0.3, "Hello.")], concurrency=1)
'''


def _installed(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """The installed ``celldialog`` console script, and how long it ran."""
    import shutil
    import time

    script = Path(sys.executable).with_name("celldialog")
    exe = str(script) if script.exists() else shutil.which("celldialog")
    assert exe, "the celldialog console script is not installed: pip install -e ."
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "CELLDIALOG_"))}
    env.update(PYTHONPATH=f"{cwd}:{REPO}", COLUMNS="200")
    started = time.perf_counter()
    done = subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    return done, time.perf_counter() - started


def test_queue_time_is_reported_apart_from_an_attempts_own(tmp_path: Path) -> None:
    (tmp_path / "queued_evals.py").write_text(QUEUED_EVALS)
    (tmp_path / "queued_models.py").write_text(QUEUED_MODELS)
    done, elapsed = _installed(["eval", "queued_evals.py", "--models",
                                "scripted:queued_models:lone", "--attempts", "4",
                                "--concurrency", "4", "--csv", "q.csv"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "queue (s)" in done.stdout
    [row] = read_csv(tmp_path / "q.csv")
    # four attempts of 0.3 s, one at a time: each attempt's time is its own (the sum fits
    # in the run), and the waiting is queue time: 0 + 0.3 + 0.6 + 0.9 s
    assert 4 * 0.3 * 0.9 <= row.seconds < elapsed
    assert row.per_attempt("seconds") < 0.6
    assert row.queue_seconds >= (0.3 + 0.6 + 0.9) * 0.9
    header = (tmp_path / "q.csv").read_text().splitlines()[0]
    assert header.split(",")[10:12] == ["wall_seconds", "queue_seconds"]


@pytest.mark.local
def test_on_the_local_model_attempts_queue_instead_of_sharing_it(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="pip install -e '.[local]'")
    (tmp_path / "queued_evals.py").write_text(QUEUED_EVALS)
    done, elapsed = _installed(["eval", "queued_evals.py", "--models", "local", "--attempts",
                                "3", "--concurrency", "3", "--csv", "l.csv"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = read_csv(tmp_path / "l.csv")
    # the attempts' own times add up to no more than the run: none counted another's turn
    assert 0 < row.seconds < elapsed and row.queue_seconds > 0
