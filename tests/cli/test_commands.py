"""``celldialog run``, ``models``, ``--help`` and every bad input, through the real script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .fakes import OpenAIServer, text
from .harness import celldialog, run

APP = '''
from runtime import cell, handler, pattern

@handler
def bump(event: int, n):
    n.set(n.get() + event)

@pattern(name="test.counter")
def counter(start: int = 0):
    n = cell(0, name="n")
    return {"n": n, "start": start, "bump": bump(n=n)}
'''


def test_help_lists_the_commands_without_loading_the_runtime(env: dict[str, str],
                                                             workdir: Path) -> None:
    done = run(["--help"], env, workdir)
    assert done.returncode == 0, done.stderr
    for name in ("chat", "run", "models", "mcp"):
        assert f"  {name} " in done.stdout
    # what --help imports: click and our package, none of the graph, the port or rich
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from runtime.cli import run; code = run(['--help']);"
         "print(sorted(m for m in sys.modules if m.startswith(('runtime.', 'rich', 'mcp',"
         " 'anyio', 'httpx'))))"],
        env=env, cwd=workdir, capture_output=True, text=True, timeout=30)
    loaded = json.loads(probe.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert loaded == ["runtime.cli", "runtime.cli.errors", "runtime.errors"], loaded


def test_run_sends_events_and_prints_the_result(env: dict[str, str], workdir: Path) -> None:
    done = run(["run", "todo", "--user", "u", "--send", 'add={"title": "milk"}',
                "--send", 'add={"title": "eggs"}', "--send", 'toggle={"index": 0}'],
               env, workdir)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "title": "Todo", "open": 1, "label": "Todo: 1 open of 2",
        "items": [{"title": "milk", "done": True}, {"title": "eggs", "done": False}],
    }


def test_run_persists_in_a_store_and_loads_a_file(env: dict[str, str], workdir: Path) -> None:
    (workdir / "app.py").write_text(APP)
    db = workdir / "app.db"
    first = run(["run", "app.py", "--store", str(db), "--send", "bump=2"], env, workdir)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"n": 2, "start": 0}
    # the same documents again: through python -m, naming the pattern, with a sqlite URL
    second = run(["run", "app.py:counter", "--store", f"sqlite:///{db}", "--send", "bump=3"],
                 env, workdir, module=True)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == {"n": 5, "start": 0}
    by_module = run(["run", "app:counter", "--store", str(db)], env, workdir)
    assert json.loads(by_module.stdout) == {"n": 5, "start": 0}


def test_run_persists_in_postgres_and_never_shows_its_password(
    env: dict[str, str], workdir: Path, pg_url: str,
) -> None:
    (workdir / "app.py").write_text(APP)
    for bump, want in ((2, 2), (3, 5)):  # a second process finds the first's documents
        done = run(["run", "app.py", "--store", pg_url, "--send", f"bump={bump}"], env, workdir)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"n": want, "start": 0}
    wrong = pg_url.replace("postgresql://postgres@", "postgresql://postgres:hunter22@") \
        .replace("host=", "host=/nonexistent") + "&connect_timeout=2"
    failed = run(["run", "app.py", "--store", wrong], env, workdir)
    assert failed.returncode != 0
    assert "cannot open PostgreSQL store" in failed.stderr and "***" in failed.stderr
    assert "hunter22" not in failed.stderr + failed.stdout


def test_run_a_dialog_pattern_against_a_loopback_model(env: dict[str, str], workdir: Path,
                                                        server: OpenAIServer) -> None:
    server.script(text("Hi, Ada."))
    done = run(["run", "chatbot", "--user", "ada", "--session", "s", "--model",
                "openai:gpt-4o-mini", "--send", 'set_notes="Call me Ada."', "--send",
                'send="hello"'], {**env, "OPENAI_BASE_URL": server.base_url}, workdir)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["pending"] is False and result["error"] is None
    assert [m["blocks"][0]["text"] for m in result["messages"]] == ["hello", "Hi, Ada."]
    assert "Call me Ada." in server.requests[0].body["messages"][0]["content"]


def test_run_exits_5_when_the_model_refuses_the_turn(env: dict[str, str], workdir: Path,
                                                     server: OpenAIServer) -> None:
    # nothing scripted: the server answers 400, the turn fails, and so does the run
    done = run(["run", "chatbot", "--model", "openai:gpt-4o-mini", "--send", 'send="hello"'],
               {**env, "OPENAI_BASE_URL": server.base_url}, workdir)
    assert done.returncode == 5, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("celldialog run: ") and "no scripted reply left" in line


def test_run_needs_no_model_when_no_dialog_runs(env: dict[str, str], workdir: Path) -> None:
    done = run(["run", "todo", "--model", "frobnicator", "--send", 'add={"title": "milk"}'],
               env, workdir)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["open"] == 1


def test_every_command_defaults_to_the_login_name_and_one_session(
        env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    me = {**env, "LOGNAME": "ada", "USER": "ada"}
    db = workdir / "todo.db"
    # todo's items are per user, the chatbot's messages per session: neither needs a flag
    first = run(["run", "todo", "--store", str(db), "--send", 'add={"title": "milk"}'], me,
                workdir)
    assert first.returncode == 0, first.stderr
    named = run(["run", "todo", "--store", str(db), "--user", "ada", "--session", "default"],
                me, workdir)
    assert json.loads(named.stdout)["items"] == [{"title": "milk", "done": False}]
    other = run(["run", "todo", "--store", str(db), "--user", "bob"], me, workdir)
    assert json.loads(other.stdout)["items"] == []
    server.script(text("Hi."))
    chat = run(["run", "chatbot", "--store", str(db), "--model", "openai:gpt-4o-mini",
                "--send", 'send="hello"'], {**me, "OPENAI_BASE_URL": server.base_url},
               workdir)
    assert chat.returncode == 0, chat.stderr
    assert len(json.loads(chat.stdout)["messages"]) == 2
    # chat sees the same session run wrote to (nothing typed: stdin is /dev/null)
    seen = run(["chat", "--store", str(db), "--model", "openai:gpt-4o-mini"],
               {**me, "OPENAI_BASE_URL": server.base_url}, workdir)
    assert seen.returncode == 0, seen.stderr
    assert "user ada · session default" in seen.stdout
    assert "resumed session 'default': 2 messages" in seen.stdout


def test_models_never_cuts_a_model_name(env: dict[str, str], workdir: Path,
                                        tmp_path: Path) -> None:
    # a catalog entry with a long name, added before the command runs (sitecustomize)
    long = "claude-sonnet-4-5-20250929-extended-context-preview"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "from runtime.llm import catalog\n"
        f"catalog.MODELS += (catalog.ModelInfo({long!r}, 'anthropic', 1_000_000, 64_000,"
        " ('long-alias-one', 'long-alias-two')),)\n")
    from runtime.llm import catalog

    def shown(extra: dict[str, str]) -> str:
        done = run(["models"], {**env, "COLUMNS": "80", **extra}, workdir)
        assert done.returncode == 0, done.stderr
        for info in catalog.MODELS:  # each name whole, beside its limits
            assert re.search(rf"^{re.escape(info.name)}\s+{info.provider}\s+"
                             rf"{info.context_window:,}\s+{info.max_output:,}\s", done.stdout,
                             re.M), (info.name, done.stdout)
        return done.stdout

    table = shown({})  # the catalog as it is fits 80 columns, no name cut
    assert all(len(line) <= 80 for line in table.splitlines()
               if not line.startswith("default model:")), table
    wide = shown({"PYTHONPATH": f"{site}:{env['PYTHONPATH']}"})
    # a name too long for 80 columns with the others: the table grows, the name stays whole
    assert re.search(rf"^{long}\s+anthropic\s+1,000,000\s+64,000\s+long-alias-one", wide,
                     re.M), wide


def test_models_shows_providers_catalog_and_default_without_the_key(
        env: dict[str, str], workdir: Path) -> None:
    bare = run(["models"], env, workdir)
    assert bare.returncode == 0, bare.stderr
    assert "not set (OPENAI_API_KEY)" in bare.stdout and "claude-sonnet-4-5" in bare.stdout
    # the resolver's default, whichever it is here (the local model, or none without the
    # local extra), and why
    assert re.search(r"default model: .*\(the default: no --model", bare.stdout), bare.stdout
    secret = "sk-test-0123456789abcdef"
    keyed = run(["models"], {**env, "OPENAI_API_KEY": secret, "CELLDIALOG_MODEL": "mini"},
                workdir)
    assert keyed.returncode == 0, keyed.stderr
    assert "set (OPENAI_API_KEY)" in keyed.stdout
    assert "default model: openai:gpt-5-mini (CELLDIALOG_MODEL in the environment)" in (
        keyed.stdout)
    assert secret not in keyed.stdout + keyed.stderr


def test_models_lists_every_provider_preset_and_price_never_a_key(
        env: dict[str, str], workdir: Path) -> None:
    from runtime.llm import catalog
    from runtime.llm.resolve import PROVIDERS

    groq, token = "gsk_test_5d2c8e7a9b1f3046", "eyJ0eXAi.entra-test.c2ln"
    done = run(["models"], {**env, "GROQ_API_KEY": groq, "OLLAMA_HOST": "0.0.0.0:11500",
                            "AZURE_OPENAI_ENDPOINT": "https://res.openai.azure.com",
                            "AZURE_OPENAI_AD_TOKEN": token}, workdir)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for provider in PROVIDERS:
        assert re.search(rf"^{re.escape(provider)}\s", out, re.M), (provider, out)
    assert re.search(r"^groq\s+set \(GROQ_API_KEY\)", out, re.M), out
    assert re.search(r"^together\s+not set \(TOGETHER_API_KEY\)", out, re.M), out
    assert re.search(r"^vllm\s+not needed \(VLLM_API_KEY\)\s+http://127.0.0.1:8000/v1", out,
                     re.M), out
    assert re.search(r"^ollama\s+.*http://127.0.0.1:11500/v1 \(OLLAMA_HOST\)", out, re.M), out
    assert re.search(r"^azure\s+set \(AZURE_OPENAI_AD_TOKEN\)\s+https://res.openai.azure.com, "
                     r"api-version 2024-10-21", out, re.M), out
    assert re.search(r"^gemini\s+not set \(GEMINI_API_KEY or GOOGLE_API_KEY\)", out, re.M), out
    prices = out[out.index("Prices"):]
    for info in catalog.MODELS:  # each model's price, "?" where unknown
        p = info.price
        cells = ["?"] * 3 if p is None else [
            f"{x:g}" if x is not None else "?" for x in (p.input, p.output, p.cached_input)]
        assert re.search(rf"^{re.escape(info.name)}\s+" + r"\s+".join(map(re.escape, cells))
                         + r"\s*$", prices, re.M), (info.name, prices)
    assert groq not in out + done.stderr and token not in out + done.stderr


def test_models_shows_configured_values_as_text_never_as_markup(
        env: dict[str, str], workdir: Path) -> None:
    """Rich reads ``[/]`` and ``[bold]`` as markup: a configured value holding them once
    crashed the command (a closing tag with nothing to close). Each is shown as written."""
    values = {"OPENAI_API_VERSION": "[/]", "AZURE_OPENAI_ENDPOINT": "https://res.example/[/]",
              "OLLAMA_BASE_URL": "http://127.0.0.1:11434/[bold]v1",
              "CELLDIALOG_MODEL": "ollama:[/]qwen"}
    done = run(["models"], {**env, **values, "COLUMNS": "200"}, workdir)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^azure\s+.*https://res\.example/\[/\], api-version \[/\]", out, re.M), out
    assert re.search(r"^ollama\s+.*http://127\.0\.0\.1:11434/\[bold\]v1 \(OLLAMA_BASE_URL\)",
                     out, re.M), out
    assert "default model: ollama:[/]qwen (CELLDIALOG_MODEL in the environment)" in out
    # a name the resolver refuses: its error quotes it, as text too
    refused = run(["models"], {**env, "CELLDIALOG_MODEL": "[/]x", "COLUMNS": "200"}, workdir)
    assert refused.returncode == 0, refused.stderr
    assert "cannot tell the provider of model '[/]x'" in refused.stdout


SECRET = "sk-live-abcdef0123456789"

BAD = [
    # (arguments, extra environment, exit status, words the line must contain)
    (["frob"], {}, 2, "No such command 'frob'"),
    (["run", "todo", "--bogus"], {}, 2, "No such option '--bogus'"),
    (["run"], {}, 2, "Missing argument 'PATTERN'"),
    (["run", "nope"], {}, 3, "unknown pattern 'nope'"),
    (["run", "no_such_module:thing"], {}, 3, "no module named 'no_such_module'"),
    (["run", "broken.py"], {}, 3, "importing 'broken.py' failed: SyntaxError"),
    (["run", "missing.py"], {}, 3, "no such file 'missing.py'"),
    (["run", "json.py"], {}, 3, "as module 'json': that name is taken"),
    (["run", "todo", "--args", "{title"], {}, 2, "--args is not valid JSON"),
    (["run", "todo", "--args", "[1]"], {}, 2, "--args must be a JSON object"),
    (["run", "todo", "--args", '{"nope": 1}', "--user", "u"], {}, 2, "unknown arguments"),
    (["run", "todo", "--send", "add"], {}, 2, "--send takes STREAM=JSON"),
    (["run", "todo", "--user", "u", "--send", "add={x"], {}, 2, "not valid JSON"),
    (["run", "todo", "--user", "u", "--send", "nope=1"], {}, 2, "has no stream 'nope'"),
    # a dialog's turn that failed on the model: run exits as chat does (4 or 5), one line
    (["run", "chatbot", "--model", "frobnicator", "--send", 'send="hi"'], {}, 4,
     "cannot tell the provider of model"),
    (["run", "chatbot", "--model", "gpt-4o", "--send", 'send="hi"'], {}, 4,
     "no API key for openai: set OPENAI_API_KEY"),
    (["run", "chatbot", "--model", "gpt-4o", "--send", 'send="hi"'],
     {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, 5,
     "cannot reach model openai:gpt-4o at http://127.0.0.1:9/v1"),
    (["run", "todo", "--user", "u", "--send", 'add={"x": 1}'], {}, 1, "'title' is a required"),
    (["run", "todo", "--store", "redis://x"], {}, 2, "unknown store 'redis://x'"),
    (["run", "todo", "--store", "sqlite:///x.db?busy_timeout=no"], {}, 2, "busy_timeout"),
    # the pattern is checked before the model's server is tried (nothing listens on port 9)
    (["chat", "todo", "--model", "openai:gpt-4o-mini"],
     {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, 3, "has no dialog to chat with"),
    (["chat", "--model", "frobnicator"], {}, 4, "cannot tell the provider of model"),
    (["chat", "--model", "gpt-4o"], {}, 4, "no API key for openai: set OPENAI_API_KEY"),
    (["chat", "--model", "gpt-4o"], {"OPENAI_API_KEY": SECRET,
                                    "OPENAI_BASE_URL": "http://example.com/v1"}, 4, "http"),
    (["chat", "--model", "gpt-4o"], {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, 5,
     "cannot reach model openai:gpt-4o at http://127.0.0.1:9/v1"),
    (["chat", "--args", "nope"], {}, 2, "--args is not valid JSON"),
    (["mcp", "nope"], {}, 3, "unknown pattern 'nope'"),
]


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory: pytest.TempPathFactory
             ) -> dict[int, subprocess.CompletedProcess[str]]:
    """Every BAD command line, run at once (each is a second of imports, mostly waiting on
    one core): their outcomes by index, each from its own clean directory and home."""
    from .conftest import clean_env

    procs = []
    for i, (args, extra, _, _) in enumerate(BAD):
        root = tmp_path_factory.mktemp(f"bad{i}")
        work = root / "work"
        work.mkdir()
        (work / "broken.py").write_text("def oops(:\n")
        (work / "json.py").write_text(APP)
        procs.append((args, subprocess.Popen(
            [celldialog(), *args], env={**clean_env(root), **extra}, cwd=work, text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    out = {}
    for i, (args, proc) in enumerate(procs):
        stdout, stderr = proc.communicate(timeout=60)
        out[i] = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize(("index", "status", "words"),
                         [(i, b[2], b[3]) for i, b in enumerate(BAD)],
                         ids=[" ".join(b[0]) for b in BAD])
def test_a_bad_input_is_one_line_and_a_status(
        bad_runs: dict[int, subprocess.CompletedProcess[str]], index: int, status: int,
        words: str) -> None:
    done = bad_runs[index]
    lines = done.stderr.splitlines()
    assert done.returncode == status, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("celldialog"), lines[0]
    assert words in lines[0]
    assert "Traceback" not in done.stderr and SECRET not in done.stderr + done.stdout
    assert done.stdout == ""


def test_the_console_script_is_installed() -> None:
    assert Path(celldialog()).name == "celldialog"
