"""docs/evals.md runs as written: every ```python block, in order, in one namespace, on
scripted models (no key, no network)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "evals.md"


def test_the_evals_page_runs_as_written(monkeypatch) -> None:
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CELLDIALOG_MODEL"):
        monkeypatch.delenv(var, raising=False)
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"__name__": "docs_evals"}
    for i, code in enumerate(blocks, 1):
        # dont_inherit: a block runs as a reader's file would; and it is not rewritten by
        # pytest, so its asserts say what a reader's would
        exec(compile(code, f"evals.md python block {i}", "exec", dont_inherit=True), namespace)


def test_the_page_names_every_eval_of_the_suite() -> None:
    from runtime.evals import load_evals

    text = PAGE.read_text()
    for e in load_evals(PAGE.parents[1] / "evals"):
        assert f"| `{e.name}` |" in text, e.name
