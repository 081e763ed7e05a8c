"""The examples in docs/llm-dialog.md and docs/builtins.md run as written: every ```python
block of a page, in order, in one namespace (later blocks use names from earlier ones, as a
reader would). They use ScriptedModel and offline fetchers, so no key or network is needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("page, at_least", [("llm-dialog.md", 4), ("builtins.md", 2)])
def test_doc_examples_run(monkeypatch, page: str, at_least: int) -> None:
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL",
                "CELLDIALOG_MODEL"):
        monkeypatch.delenv(var, raising=False)
    doc = DOCS / page
    blocks = re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)
    assert len(blocks) >= at_least
    namespace: dict[str, object] = {"__name__": f"docs_{doc.stem.replace('-', '_')}"}
    for i, code in enumerate(blocks, 1):
        # dont_inherit: a block runs as a reader's file would, without this file's
        # `from __future__ import annotations` (dataclasses there resolve their annotations)
        exec(compile(code, f"{doc.name} python block {i}", "exec", dont_inherit=True),
             namespace)
