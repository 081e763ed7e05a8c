"""docs/conversation.md runs as written: every ```python block, in order, in one namespace
(later blocks use names from earlier ones, as a reader would). ScriptedModel stands in for a
provider, so no key or network is needed (the MCP example starts a real stdio server)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "conversation.md"


def test_the_conversation_page_runs_as_written(monkeypatch) -> None:
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL",
                "CELLDIALOG_MODEL", "CELLDIALOG_SMALL_MODEL"):
        monkeypatch.delenv(var, raising=False)
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 10
    namespace: dict[str, object] = {"__name__": "docs_conversation"}
    for i, code in enumerate(blocks, 1):
        # dont_inherit: a block runs as a reader's file would, without this file's
        # `from __future__ import annotations`
        exec(compile(code, f"conversation.md python block {i}", "exec", dont_inherit=True),
             namespace)
