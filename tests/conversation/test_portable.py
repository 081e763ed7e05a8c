"""portable_id: a round trip through another process that restores and continues the
conversation, what the recipe keeps (and drops), and what it refuses."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from runtime import LLM
from runtime.conversation import ImportedModel, PortableIdError
from runtime.llm import Reply, ScriptedModel, call
from tests.conversation.fixtures import Notebook

pytestmark = pytest.mark.anyio
LIMIT = 30
ROOT = Path(__file__).resolve().parents[2]

CONTINUE = """
import json, sys
import anyio
from runtime import LLM

async def main():
    llm = LLM.restore(sys.stdin.read())
    done = await llm.with_prompt("Add eggs, then count.").loop(max_steps=5)
    notebook = done._state.objects[0].obj
    print(json.dumps({"reply": done.last_reply, "lines": list(notebook.lines),
                      "messages": len(done.messages), "system": list(done._state.system_prompts),
                      "effort": done.reasoning_effort, "model": done.model,
                      "tokens": done.token_usage.total_tokens}))

anyio.run(main)
"""


def recipe(portable_id: str) -> dict:
    body = portable_id.removeprefix("cdllm1.")
    return json.loads(zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))


async def test_another_process_restores_and_continues_the_conversation() -> None:
    from runtime.llm import Usage

    first = ScriptedModel([Reply(tool_calls=[call("add", {"line": "milk"})],
                                 usage=Usage(input_tokens=9, output_tokens=1)), "Noted."])
    with anyio.fail_after(LIMIT):
        done = await (LLM(model=first).with_system_prompt("Be brief.")
                      .with_reasoning_effort("medium").with_tools(Notebook())
                      .with_prompt("Note milk.").loop())
    portable = done.with_model(
        ImportedModel("tests.conversation.fixtures:continuation_model")).portable_id
    assert portable.startswith("cdllm1.") and portable.isascii()
    out = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-c", CONTINUE], input=portable, capture_output=True, text=True,
        cwd=ROOT, timeout=LIMIT))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"reply": "You have 2 notes.", "lines": ["milk", "eggs"],
                   "messages": 4 + 6, "system": ["Be brief."], "effort": "medium",
                   "model": "scripted", "tokens": 10}


async def test_the_recipe_is_flattened() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("add", {"line": "a"})]),
                           Reply(tool_calls=[call("add", {"line": "b"})]), "ok"])
    with anyio.fail_after(LIMIT):
        done = await (LLM(model=model).with_tools(Notebook(("old",))).with_tools(Notebook())
                      .with_prompt("x").loop())
    r = recipe(done.with_mcp_server("echo", "python3", ("server.py",), {"TOKEN": "t0k3n"})
               .portable_id)
    assert r["objects"] == [{"type": "tests.conversation.fixtures:Notebook",
                             "state": {"lines": ["a", "b"]}, "except": []}]
    assert r["mcp"][0]["command"] == "python3" and r["mcp"][0]["args"] == ["server.py"]
    restored = LLM.restore(done.portable_id, model=ScriptedModel())
    assert restored._state.objects[0].obj.lines == ("a", "b")  # a tuple again
    assert restored.messages == done.messages
    mcp = LLM.restore(done.with_mcp_server("echo", "python3").portable_id,
                      model=ScriptedModel())
    assert mcp._state.mcp[0].command == "python3"


@dataclass
class _Local:
    n: int = 0

    def get(self) -> int:
        return self.n


class Plain:
    def __init__(self) -> None:
        self.state = [1]

    def get(self) -> list[int]:
        return self.state


async def test_what_cannot_be_saved_is_refused_with_the_reason() -> None:
    base = LLM(model=ScriptedModel())
    with pytest.raises(PortableIdError, match="make it a dataclass or a pydantic model"):
        _ = base.with_tools(Plain()).portable_id

    def local() -> type:
        @dataclass
        class Inner:
            def get(self) -> int:
                return 1

        return Inner

    with pytest.raises(PortableIdError, match="cannot import"):
        _ = base.with_tools(local()()).portable_id
    with pytest.raises(PortableIdError, match="ScriptedModel"):
        LLM.restore(base.with_prompt("x").portable_id)
    with pytest.raises(PortableIdError, match="not a conversation's portable id"):
        LLM.restore("hello")
    with pytest.raises(PortableIdError, match="damaged"):
        LLM.restore("cdllm1.@@@@")
    assert LLM.restore(LLM(model="sonnet").with_prompt("hi").portable_id).model == \
        "claude-sonnet-4-5"
    assert LLM.restore(base.with_tools(_Local(3)).portable_id,
                       model=ScriptedModel())._state.objects[0].obj == _Local(3)


SCRIPT_CLASSES = """
import dataclasses
from runtime import LLM
from runtime.conversation import PortableIdError
from runtime.llm import ScriptedModel

class Plain:  # state in a plain class, in the script being run (module __main__)
    def __init__(self):
        self.lines = []

    def add(self, line: str) -> str:
        self.lines.append(line)
        return "ok"

@dataclasses.dataclass
class Saved:
    lines: tuple[str, ...] = ()

    def add(self, line: str) -> str:
        return "ok"

for obj in (Plain(), Saved()):
    try:
        LLM(model=ScriptedModel()).with_tools(obj).portable_id
    except PortableIdError as e:
        print(type(obj).__name__, "->", e)
"""


def _script(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` as a reader's ``python script.py``: its classes are ``__main__``'s."""
    import os

    (cwd / "script.py").write_text(code)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "CELLDIALOG_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "script.py"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_scripts_classes_are_refused_for_what_they_are_first(tmp_path: Path) -> None:
    done = _script(SCRIPT_CLASSES, tmp_path)
    assert done.returncode == 0, done.stderr
    plain, saved = done.stdout.strip().splitlines()
    # the same refusal as from a module: the state is what to fix first
    assert plain.startswith("Plain -> ") and "make it a dataclass or a pydantic model" in plain
    # a dataclass saves, but another process cannot import a script's class: the fix named
    assert saved.startswith("Saved -> ") and "defined in the script being run" in saved
    assert "move the class into a module" in saved


def test_the_conversation_page_runs_as_a_pasted_script(tmp_path: Path) -> None:
    """docs/conversation.md's python blocks, in order, as one ``python script.py``: what a
    reader pasting them gets (tests/conversation/test_docs.py runs them in a namespace of
    its own, which is no ``__main__``)."""
    import re

    page = (ROOT / "docs" / "conversation.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    done = _script("\n".join(blocks), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
