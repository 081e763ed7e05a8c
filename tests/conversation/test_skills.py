"""Skills: the SKILL.md parser, discovery beneath directories, precedence (built-in >
installed > workspace), ListSkills/ReadSkill, and hostile trees (malformed files, duplicates,
traversal, symlinks, huge and binary files, unicode names). Trees are built in tmp_path."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import anyio
import pytest

from runtime.conversation.skills import (
    BUILTIN_DIRECTORY,
    LIST_SKILLS,
    MAX_READ_CHARS,
    READ_SKILL,
    SkillError,
    SkillFormatError,
    Skills,
    SkillsToolset,
    parse_skill_md,
)
from runtime.conversation.toolset import Toolset
from runtime.llm import Message, Request, Role
from runtime.llm.scripted import Reply, ScriptedModel, call
from runtime.llm.steps import StepsStatus, ToolError, run_steps

pytestmark = pytest.mark.anyio

BUILTINS = {"using-skills", "celldialog-workspace"}


def skill(root: Path, rel: str, name: str, description: str = "Does things.",
          body: str = "Body.", **files: str) -> Path:
    """Write ``root/rel/SKILL.md`` (and ``files``, ``__`` standing for ``/``)."""
    directory = root / rel
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n---\n{body}\n", encoding="utf-8")
    for key, text in files.items():
        path = directory / key.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return directory


def names(skills: Skills) -> list[tuple[str, str]]:
    return [(s.name, s.source) for s in skills.skills if s.source != "builtin"]


# ---------------------------------------------------------------------- the parser


def test_parses_plain_quoted_and_block_values() -> None:
    text = "\ufeff---\r\n" + "\r\n".join([
        "# a comment",
        "name: 'it''s-a-skill'",
        'description: "Line one,\\n\\u00e9 two"',
        "license: MIT  # trailing comment",
        "allowed-tools: [Read, Write]",
        "metadata:",
        "  version: 1",
        "  tags:",
        "    - x",
        "---",
        "",
        "# Body",
        "text",
    ])
    fields, body = parse_skill_md(text)
    assert fields == {"name": "it's-a-skill", "description": "Line one,\né two",
                      "license": "MIT"}
    assert body == "# Body\ntext"
    folded, _ = parse_skill_md("---\nname: x\ndescription: >\n  one\n  two\n\n  three\n---\n")
    assert folded["description"] == "one two\nthree"
    literal, _ = parse_skill_md("---\nname: x\ndescription: |\n  a\n    b\n---\n")
    assert literal["description"] == "a\n  b"
    plain, _ = parse_skill_md("---\nname: x\ndescription: Use for\n  C# work # not this\n---\n")
    assert plain["description"] == "Use for C# work"  # ' #' starts a comment, 'C#' does not


@pytest.mark.parametrize(("text", "message"), [
    ("# Title\nno frontmatter", "does not start with frontmatter"),
    ("", "does not start with frontmatter"),
    ("---\nname: x\ndescription: y\n", "not closed"),
    ("---\ndescription: y\n---\n", "no 'name'"),
    ("---\nname: x\n---\n", "no 'description'"),
    ("---\nname: x\nname: y\ndescription: z\n---\n", "line 3: 'name' appears twice"),
    ("---\nname:\n  first: x\ndescription: z\n---\n", "'name' must be a single string"),
    ("---\nname: [x]\ndescription: z\n---\n", "'name' must be a single string"),
    ("---\nname: 'x\ndescription: z\n---\n", "never closed"),
    ('---\nname: "a\\qb"\ndescription: z\n---\n', "invalid escape"),
    ("---\nname: 'x' y\ndescription: z\n---\n", "unexpected 'y'"),
    ("---\nname x\ndescription: z\n---\n", "line 2: expected 'key: value'"),
    ("---\n  name: x\ndescription: z\n---\n", "unexpected indentation"),
    ("---\nname: a/b\ndescription: z\n---\n", "contains '/'"),
    ("---\nname: ''\ndescription: z\n---\n", "'name' is empty"),
    ("---\nname: x\ndescription: " + "d" * 1025 + "\n---\n", "1025 characters"),
    ("---\nname: " + "n" * 65 + "\ndescription: d\n---\n", "65 characters"),
])
def test_malformed_frontmatter_is_refused_saying_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SkillFormatError, match=message):
        parse_skill_md(text)


# ---------------------------------------------------------------------- discovery


def test_builtin_skills_are_always_there_and_valid() -> None:
    index = Skills().scan()
    assert {s.name for s in index.skills} == BUILTINS
    assert all(s.source == "builtin" for s in index.skills)
    assert index.ignored == ()
    for s in index.skills:
        assert s.path.is_relative_to(BUILTIN_DIRECTORY)
        assert len(s.description) > 40  # descriptions that say when to use them


def test_skills_are_found_anywhere_beneath_and_malformed_ones_skipped_with_a_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    skill(tmp_path, "a/deep/down/under", "deep")
    skill(tmp_path, "b", "top")
    skill(tmp_path, "", "root")  # the directory itself may be a skill
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "SKILL.md").write_text("# no frontmatter here\n")
    skill(tmp_path, "node_modules/pkg", "vendored")  # not entered
    caplog.set_level(logging.WARNING, "celldialog.conversation.skills")
    skills = Skills().with_skills(tmp_path)
    index = skills.scan()
    assert [(s.name, s.source) for s in index.skills if s.source != "builtin"] == [
        ("root", "installed"), ("deep", "installed"), ("top", "installed")]
    [broken] = index.ignored
    assert broken.path == tmp_path.resolve() / "broken" / "SKILL.md"
    assert "malformed SKILL.md: it does not start with frontmatter" in broken.reason
    assert "broken/SKILL.md" in caplog.text and "does not start with frontmatter" in caplog.text


def test_precedence_builtin_then_installed_then_workspace(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = tmp_path / "first"
    second = tmp_path / "second"
    work = tmp_path / "work"
    skill(first, "x", "shared", "from first")
    skill(first, "y", "only-first")
    skill(second, "x", "SHARED", "from second")  # names compare case-insensitively
    skill(second, "z", "Using-Skills", "an attempt to shadow a built-in")
    skill(work, "w", "shared", "from the workspace")
    skill(work, "v", "only-work")
    caplog.set_level(logging.WARNING, "celldialog.conversation.skills")
    skills = Skills().with_skills(first).with_skills(second).with_workspace_directory(work)
    index = skills.scan()
    assert names(skills) == [("only-first", "installed"), ("SHARED", "installed"),
                             ("only-work", "workspace")]
    assert index.get("shared").description == "from second"  # the later installation wins
    builtin = index.get("using-skills")
    assert builtin.source == "builtin" and builtin.path.is_relative_to(BUILTIN_DIRECTORY)
    reasons = {i.path.parent.name + "@" + i.path.parent.parent.name: i.reason
               for i in index.ignored}
    assert "built-in skill, which cannot be shadowed" in reasons["z@second"]
    assert "overridden by" in reasons["x@first"]
    assert "already provided by" in reasons["w@work"]
    assert "cannot be shadowed" in caplog.text


def test_reinstalling_a_directory_moves_it_last(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    skill(a, "s", "same", "from a")
    skill(b, "s", "same", "from b")
    skills = Skills().with_skills(a).with_skills(b).with_skills(a)
    assert skills.installed == (b.resolve(), a.resolve())
    assert skills.scan().get("same").description == "from a"


def test_duplicate_names_in_one_directory_keep_the_first_by_path(tmp_path: Path) -> None:
    skill(tmp_path, "b", "twin", "from b")
    skill(tmp_path, "a", "twin", "from a")
    index = Skills().with_skills(tmp_path).scan()
    assert index.get("twin").description == "from a"
    [dup] = index.ignored
    assert "a second skill named 'twin'" in dup.reason and dup.path.parent.name == "b"


def test_unicode_names_compare_normalised(tmp_path: Path) -> None:
    skill(tmp_path, "fr", "re\u0301sume\u0301-writer")  # NFD on disk
    skill(tmp_path, "ja", "日本語メモ", "メモを書く。")
    skill(tmp_path, "fw", "ｕｓｉｎｇ-ｓｋｉｌｌｓ", "full-width look-alike of a built-in")
    index = Skills().with_skills(tmp_path).scan()
    assert index.get("résumé-writer") is not None  # NFC query, NFD file
    assert index.get("RÉSUMÉ-WRITER").name == "r\u00e9sum\u00e9-writer"  # stored NFC
    assert index.get("日本語メモ").description == "メモを書く。"
    [shadow] = index.ignored
    assert "cannot be shadowed" in shadow.reason


def test_symlinks_do_not_pull_in_skills_from_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    skill(outside, "s", "outsider")
    root = tmp_path / "root"
    root.mkdir()
    (root / "linked-dir").symlink_to(outside, target_is_directory=True)
    (root / "single").mkdir()
    (root / "single" / "SKILL.md").symlink_to(outside / "s" / "SKILL.md")
    index = Skills().with_skills(root).scan()
    assert index.get("outsider") is None
    [ignored] = index.ignored
    assert "symlink leading out" in ignored.reason


def test_a_huge_frontmatter_is_skipped_not_read_whole(tmp_path: Path) -> None:
    directory = tmp_path / "huge"
    directory.mkdir()
    (directory / "SKILL.md").write_text("---\nname: huge\ndescription: d\n"
                                        + "# filler\n" * 20_000)
    index = Skills().with_skills(tmp_path).scan()
    assert index.get("huge") is None
    assert "does not end within the first 64 KiB" in index.ignored[0].reason


def test_a_directory_deleted_after_installation_is_reported(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    skill(gone, "s", "soon-gone")
    skills = Skills().with_skills(gone)
    (gone / "s" / "SKILL.md").unlink()
    (gone / "s").rmdir()
    gone.rmdir()
    index = skills.scan()
    assert "does not exist" in index.ignored[0].reason
    assert {s.name for s in index.skills} == BUILTINS


def test_with_skills_refuses_what_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SkillError, match="is not a directory"):
        Skills().with_skills(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SkillError, match="is not a directory"):
        Skills().with_skills(tmp_path / "file")
    with pytest.raises(TypeError, match=r"installed=\("):
        Skills(installed=str(tmp_path))  # type: ignore[arg-type]


def test_round_trips_through_json(tmp_path: Path) -> None:
    skill(tmp_path / "i", "s", "one")
    skill(tmp_path / "w", "s", "two")
    skills = Skills().with_skills(tmp_path / "i").with_workspace_directory(tmp_path / "w")
    data = json.loads(json.dumps(skills.to_json()))
    assert data == {"installed": [str((tmp_path / "i").resolve())],
                    "workspace": [str((tmp_path / "w").resolve())]}
    again = Skills.from_json(data)
    assert again == skills and hash(again) == hash(skills)
    assert Skills.from_json(json.dumps(data)).skills == skills.skills
    with pytest.raises(ValueError, match="unknown keys"):
        Skills.from_json({"installed": [], "builtin": []})
    with pytest.raises(TypeError, match="list of directory paths"):
        Skills.from_json({"installed": "one/path"})


# ---------------------------------------------------------------------- the tools


async def open_toolset(root: Path) -> SkillsToolset:
    with anyio.fail_after(10):
        return await Skills().with_skills(root).open()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    skill(root, "pdf", "pdf-forms", "Fill PDF forms.", "# PDF\nRead reference.md first.",
          **{"reference.md": "Field types: text, checkbox.",
             "scripts__fill.py": "print('fill')\n"})
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    (root / "pdf" / "escape.txt").symlink_to(tmp_path / "secret.txt")
    (root / "pdf" / "escape-dir").symlink_to(tmp_path, target_is_directory=True)
    (root / "pdf" / "inner.txt").symlink_to(root / "pdf" / "reference.md")  # stays inside
    return root


async def test_the_toolset_lists_exactly_what_skills_gives(tree: Path) -> None:
    toolset = await open_toolset(tree)
    assert isinstance(toolset, Toolset)
    assert [t.name for t in await toolset.list_tools()] == [LIST_SKILLS, READ_SKILL]
    listing = await toolset.call(LIST_SKILLS, {})
    assert listing == [s.listing() for s in Skills().with_skills(tree).skills]
    assert {"name": "pdf-forms", "description": "Fill PDF forms.",
            "source": "installed"} in listing
    await toolset.aclose()
    await toolset.aclose()
    with pytest.raises(ToolError, match="closed"):
        await toolset.call(LIST_SKILLS, {})


async def test_read_skill_returns_the_body_and_the_files_beside_it(tree: Path) -> None:
    toolset = await open_toolset(tree)
    text = await toolset.call(READ_SKILL, {"name": "PDF-Forms"})
    assert text.startswith("# PDF\nRead reference.md first.\n\nFiles in skill 'pdf-forms'")
    assert "---" not in text.split("Files in")[0] and "description:" not in text
    assert "- reference.md" in text and "- scripts/fill.py" in text
    assert await toolset.call(READ_SKILL, {"name": "pdf-forms", "path": "reference.md"}) == \
        "Field types: text, checkbox."
    assert await toolset.call(READ_SKILL, {"name": "pdf-forms", "path": "inner.txt"}) == \
        "Field types: text, checkbox."
    folder = await toolset.call(READ_SKILL, {"name": "pdf-forms", "path": "scripts"})
    assert "- scripts/fill.py" in folder
    with pytest.raises(ToolError, match=r"no skill 'nope'.*'pdf-forms'"):
        await toolset.call(READ_SKILL, {"name": "nope"})
    with pytest.raises(ToolError, match=r"no file 'missing.md'.*'reference.md'"):
        await toolset.call(READ_SKILL, {"name": "pdf-forms", "path": "missing.md"})


@pytest.mark.parametrize(("path", "message"), [
    ("../../secret.txt", "contains '..'"),
    ("scripts/../../secret.txt", "contains '..'"),
    ("..\\..\\secret.txt", "contains '..'"),
    ("/etc/passwd", "absolute path"),
    ("\\\\server\\share", "absolute path"),
    ("C:\\Windows\\win.ini", "absolute path"),
    ("~/.ssh/id_rsa", "absolute path"),
    ("escape.txt", "leads out of the directory"),
    ("escape-dir/secret.txt", "leads out of the directory"),
    ("escape-dir", "leads out of the directory"),
    ("a\0b", "relative file path"),
])
async def test_read_skill_refuses_paths_leaving_the_skill(tree: Path, path: str,
                                                          message: str) -> None:
    toolset = await open_toolset(tree)
    with pytest.raises(ToolError, match=message) as info:
        await toolset.call(READ_SKILL, {"name": "pdf-forms", "path": path})
    assert "TOP SECRET" not in str(info.value)


async def test_big_files_are_read_in_capped_pages(tmp_path: Path) -> None:
    body = "".join(f"{i:09d}\n" for i in range(12_000))  # 120,000 characters
    skill(tmp_path, "big", "big", body=body, **{"data.txt": "é" * (MAX_READ_CHARS + 10)})
    toolset = await open_toolset(tmp_path)
    first = await toolset.call(READ_SKILL, {"name": "big"})
    assert first.startswith(body[:MAX_READ_CHARS])
    assert f"characters 0-{MAX_READ_CHARS} of" in first
    assert f"offset={MAX_READ_CHARS} to read on" in first
    assert len(first) < MAX_READ_CHARS + 300
    second = await toolset.call(READ_SKILL, {"name": "big", "offset": MAX_READ_CHARS})
    assert second.startswith(body[MAX_READ_CHARS:2 * MAX_READ_CHARS])
    rest = await toolset.call(READ_SKILL, {"name": "big", "offset": 2 * MAX_READ_CHARS})
    assert rest.startswith(body[2 * MAX_READ_CHARS:]) and "- data.txt" in rest
    data = await toolset.call(READ_SKILL, {"name": "big", "path": "data.txt"})
    assert data.startswith("é" * MAX_READ_CHARS + "\n\n[... truncated")
    tail = await toolset.call(READ_SKILL, {"name": "big", "path": "data.txt",
                                           "offset": MAX_READ_CHARS})
    assert tail == "é" * 10
    with pytest.raises(ToolError, match="past the end"):
        await toolset.call(READ_SKILL, {"name": "big", "path": "data.txt", "offset": 10**9})


async def test_binary_files_are_not_shown(tmp_path: Path) -> None:
    directory = skill(tmp_path, "img", "images")
    (directory / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    toolset = await open_toolset(tmp_path)
    with pytest.raises(ToolError, match=r"binary file \(16 bytes\)"):
        await toolset.call(READ_SKILL, {"name": "images", "path": "logo.png"})


async def test_builtin_skills_are_readable_with_their_files() -> None:
    toolset = await Skills().open()
    text = await toolset.call(READ_SKILL, {"name": "using-skills"})
    assert "ListSkills" in text and "- writing-skills.md" in text
    guide = await toolset.call(READ_SKILL, {"name": "using-skills",
                                            "path": "writing-skills.md"})
    assert guide.startswith("# Writing a skill")
    workspace = await toolset.call(READ_SKILL, {"name": "celldialog-workspace"})
    assert "workspace_read" in workspace


async def test_a_model_uses_the_skills_through_the_step_engine(tree: Path) -> None:
    """The schemas pass the engine's argument check, and the outputs reach the model."""
    toolset = await open_toolset(tree)
    tools = tuple(await toolset.list_tools())
    model = ScriptedModel([
        Reply(tool_calls=[call(LIST_SKILLS), call(READ_SKILL, {"name": "pdf-forms"}),
                          call(READ_SKILL, {"name": "pdf-forms", "path": "/etc/passwd"}),
                          call(READ_SKILL, {})]),
        "Done.",
    ])

    async def execute(use):
        return await toolset.call(use.name, use.input)

    with anyio.fail_after(10):
        outcome = await run_steps(
            model, lambda history, step: Request(messages=tuple(history), tools=tools),
            execute=execute, history=(Message.text(Role.USER, "Fill the form."),))
    assert outcome.status is StepsStatus.COMPLETED
    results = outcome.messages[1].blocks
    assert not results[0].is_error and '"name":"pdf-forms"' in results[0].content
    assert not results[1].is_error and results[1].content.startswith("# PDF")
    assert results[2].is_error and "absolute path" in results[2].content
    assert results[3].is_error and "Invalid arguments" in results[3].content  # no name


def test_skill_files_can_be_written_unreadable(tmp_path: Path) -> None:
    """An unreadable SKILL.md is skipped with its reason, not an exception."""
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    directory = skill(tmp_path, "locked", "locked")
    (directory / "SKILL.md").chmod(0)
    try:
        index = Skills().with_skills(tmp_path).scan()
    finally:
        (directory / "SKILL.md").chmod(0o644)
    assert index.get("locked") is None and "unreadable" in index.ignored[0].reason
