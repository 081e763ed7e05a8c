"""The examples in docs/llm-port.md run as written: every ```python block, in order, in one
namespace (later blocks use names from earlier ones, as a reader would)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "llm-port.md"


def test_doc_examples_run(monkeypatch) -> None:
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 8
    namespace: dict[str, object] = {"__name__": "docs_llm_port"}
    for i, code in enumerate(blocks, 1):
        exec(compile(code, f"{DOC.name} python block {i}", "exec"), namespace)
