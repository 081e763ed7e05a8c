"""The main job on a fresh machine: ``celldialog chat`` with no key, on the embedded model."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Terminal

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: "
                    "pip install -e '.[local]'")
pytest.importorskip("runtime.llm.providers.local")

pytestmark = pytest.mark.local


def test_chat_runs_offline_on_the_local_model_and_says_so(env: dict[str, str],
                                                           workdir: Path) -> None:
    term = Terminal(["chat", "--store", "memory"], env, workdir)  # no key, no model named
    try:
        term.expect(r"model: local:\S+ \(the default: no --model and CELLDIALOG_MODEL unset, "
                    r"so the embedded local model, offline\)")
        term.expect(r"a tiny model: in the todo agent it makes the right call for \d+ of 10 "
                    r"plain \"add\" requests .* for real work use a provider: --model sonnet")
        term.expect(r"leaves\.\s*\n")
        term.expect(r"you> ")
        term.line("Say hello.")
        term.expect(r"assistant> \S.*\n", timeout=60)
        term.expect(r"you> ", timeout=60)
        term.ctrl_d()
        assert term.wait() == 0
    finally:
        term.close()
    assert "error:" not in term.raw and "Traceback" not in term.raw
