"""Skills: instructions the model finds with ``ListSkills`` and reads with ``ReadSkill``.

A skill is a directory holding a ``SKILL.md`` (Anthropic's Agent Skills convention)::

    ---
    name: pdf-forms
    description: Fill in PDF forms. Use when the user gives a PDF with fields to complete.
    ---
    # Filling PDF forms
    1. ... (the body: what the model reads when it picks the skill)

plus any files beside it (``reference.md``, ``scripts/fill.py``) that the body points to.
Skills are found anywhere beneath a directory (every ``SKILL.md`` in the tree; symlinked
directories and ``.git``/``node_modules``-like directories are not entered).

``Skills`` is an immutable value listing where skills come from, in precedence order:

1. **built-in** skills, shipped with the engine (``builtin_skills/``): always present and
   never shadowed: a skill elsewhere with a built-in's name is ignored, with a warning log
   record and an entry in ``SkillIndex.ignored``;
2. **installed** skills (``with_skills(directory)``): listed in installation order; a later
   installation wins over an earlier one with the same name (the latest call decides, as
   with every ``with_*``); within one directory the first by path order wins;
3. **workspace** skills (``with_workspace_directory(directory)``): lowest precedence.

Names compare Unicode-normalised and case-insensitively (NFKC, casefold), so ``PDF`` cannot
sit beside ``pdf`` nor a full-width look-alike shadow a built-in; unicode names are fine.

Frontmatter is read by a small strict parser, not a YAML library: ``key: value`` lines between
two ``---`` lines; values plain, ``'single'``- or ``"double"``-quoted (JSON escapes), or ``|``
/ ``>`` block scalars; nested values of other keys (``metadata:``, ``allowed-tools: [...]``)
are skipped. ``name`` (1-64 characters, no ``/``, ``\\`` or control characters) and
``description`` (1-1024 characters) must be strings. A malformed ``SKILL.md`` does not break the
conversation: it is **skipped**, with a warning log record and an entry in ``ignored`` saying
what is wrong (``SkillFormatError`` is raised only by ``parse_skill_md`` itself).

Reading: ``ReadSkill(name)`` returns the ``SKILL.md`` body (frontmatter removed) followed by
the list of the skill's other files; ``ReadSkill(name, path)`` a file inside the skill's
directory (or the listing of a subdirectory). Absolute paths, ``..`` and symlinks that lead
out of the skill's directory are refused. One call returns at most ``MAX_READ_CHARS``
characters and says how to read on (``offset``); binary files are not shown; files above
``MAX_FILE_BYTES`` are read up to that size only.

Serialisation: ``to_json``/``from_json`` carry the directories by absolute path (built-ins are
the engine's own and are not carried); the skills are read from disk again when used.
``Skills.open()`` scans once and returns the ``Toolset`` the conversation offers the model.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import anyio

from ..errors import CelldialogError
from ..llm.steps import ToolError, ToolOutput
from ..llm.types import Tool

__all__ = [
    "BUILTIN_DIRECTORY",
    "LIST_SKILLS",
    "MAX_FILE_BYTES",
    "MAX_READ_CHARS",
    "READ_SKILL",
    "IgnoredSkill",
    "Skill",
    "SkillError",
    "SkillFormatError",
    "SkillIndex",
    "Skills",
    "SkillsToolset",
    "parse_skill_md",
]

LOGGER = logging.getLogger("celldialog.conversation.skills")

LIST_SKILLS = "ListSkills"
READ_SKILL = "ReadSkill"
SKILL_FILE = "SKILL.md"
BUILTIN_DIRECTORY = Path(__file__).with_name("builtin_skills")
"""Where the engine's own skills live (package data)."""

MAX_READ_CHARS = 50_000
"""The most characters one ``ReadSkill`` call returns; the rest is read with ``offset``."""
MAX_FILE_BYTES = 8 * 1024 * 1024
"""Files are read up to this size; a bigger one is cut there (and says so)."""
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024

_HEAD_BYTES = 64 * 1024  # where the frontmatter of a SKILL.md must end
_MAX_DIRS = 20_000  # directories visited under one root before the scan stops
_MAX_LISTED_FILES = 200  # files named in a skill's listing
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv",
                        ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache"})

Source = Literal["builtin", "installed", "workspace"]


class SkillError(CelldialogError, ValueError):
    """A skills directory that cannot be used (not a directory, say)."""


class SkillFormatError(SkillError):
    """A ``SKILL.md`` that does not follow the format; the message says where and how."""


# ---------------------------------------------------------------------- frontmatter


class _Complex:
    """The value of a key that holds a nested mapping, list or flow collection (skipped)."""

    def __repr__(self) -> str:
        return "<nested value>"


_COMPLEX = _Complex()
_KEY = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*)[ \t]*:(?:[ \t]+(.*))?")
_BLOCK = re.compile(r"[|>][+-]?")


def parse_skill_md(text: str) -> tuple[dict[str, str], str]:
    """``(fields, body)`` of a SKILL.md's text: the frontmatter's string values (``name`` and
    ``description`` checked and normalised) and the body after it. Raises ``SkillFormatError``
    saying which line is wrong and how to write it."""
    fields, body = _split(text)
    out: dict[str, str] = {k: v for k, v in fields.items() if isinstance(v, str)}
    for key, limit in (("name", MAX_NAME_CHARS), ("description", MAX_DESCRIPTION_CHARS)):
        value = fields.get(key)
        if value is None:
            raise SkillFormatError(
                f"the frontmatter has no {key!r}: add a line '{key}: ...' between the '---' "
                "lines (a skill needs a name and a description)")
        if not isinstance(value, str):
            raise SkillFormatError(f"{key!r} must be a single string, not a nested value")
        value = unicodedata.normalize("NFC", " ".join(value.split()) if key == "name"
                                      else value.strip())
        if not value:
            raise SkillFormatError(f"{key!r} is empty")
        if len(value) > limit:
            raise SkillFormatError(f"{key!r} has {len(value)} characters; the most is {limit}")
        if key == "name":
            bad = [c for c in value if c in "/\\" or unicodedata.category(c).startswith("C")]
            if bad:
                raise SkillFormatError(f"'name' {value!r} contains {bad[0]!r}: a name has no "
                                       "slashes or control characters (e.g. 'pdf-forms')")
        out[key] = value
    return out, body


def _split(text: str) -> tuple[dict[str, str | _Complex], str]:
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines or lines[0].rstrip() != "---":
        raise SkillFormatError(
            "it does not start with frontmatter: the first line must be '---', followed by "
            "'name: ...' and 'description: ...' lines and a closing '---'")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].rstrip() == "---")
    except StopIteration:
        raise SkillFormatError("the frontmatter is not closed: add a '---' line after "
                               "its last 'key: value' line") from None
    fields = _mapping(lines[1:end])
    body = "\n".join(lines[end + 1:]).strip("\n")
    return fields, body


def _mapping(lines: list[str]) -> dict[str, str | _Complex]:
    fields: dict[str, str | _Complex] = {}
    i = 0
    while i < len(lines):
        line, number = lines[i], i + 2  # the line number in the file
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[:1].isspace():
            raise SkillFormatError(f"line {number}: unexpected indentation; a key starts at "
                                   "the beginning of its line")
        match = _KEY.fullmatch(line.rstrip())
        if match is None:
            raise SkillFormatError(f"line {number}: expected 'key: value', got {stripped!r}")
        key, raw = match.group(1), (match.group(2) or "").strip()
        if key in fields:
            raise SkillFormatError(f"line {number}: {key!r} appears twice")
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
            block.append(lines[i])
            i += 1
        fields[key] = _value(raw, block, number, key)
    return fields


def _value(raw: str, block: list[str], number: int, key: str) -> str | _Complex:
    if _BLOCK.fullmatch(raw):
        return _block_scalar(raw, block)
    if raw[:1] in ("'", '"'):
        return _quoted(" ".join([raw, *(b.strip() for b in block if b.strip())]), number, key)
    if raw[:1] in ("[", "{", "&", "*", "!", "|", ">", "%", "@", "`"):
        return _COMPLEX  # a flow collection, anchor or tag: not a plain string
    continued = [b.strip() for b in block]
    first = next((c for c in continued if c), "")
    if not raw and (first.startswith("- ") or first == "-" or _KEY.fullmatch(first)):
        return _COMPLEX  # a nested mapping or list
    text = _strip_comment(raw)
    return _fold([text, *(_strip_comment(c) for c in continued)])


def _strip_comment(text: str) -> str:
    return re.split(r"\s#", text, maxsplit=1)[0].rstrip() if not text.startswith("#") else ""


def _fold(parts: Sequence[str]) -> str:
    """YAML line folding: lines join with a space, an empty line is a newline."""
    out, para = [], []
    for part in parts:
        if part:
            para.append(part)
        elif para:
            out.append(" ".join(para))
            para = []
    if para:
        out.append(" ".join(para))
    return "\n".join(out)


def _block_scalar(indicator: str, block: list[str]) -> str:
    content = [b for b in block if b.strip()]
    indent = min((len(b) - len(b.lstrip()) for b in content), default=0)
    lines = [b[indent:] if b.strip() else "" for b in block]
    if indicator.startswith("|"):
        return "\n".join(lines).strip("\n")
    return _fold(lines)


def _quoted(text: str, number: int, key: str) -> str:
    quote = text[0]
    i = 1
    while i < len(text):
        c = text[i]
        if quote == '"' and c == "\\":
            i += 2
            continue
        if c == quote:
            if quote == "'" and text[i + 1:i + 2] == "'":
                i += 2
                continue
            break
        i += 1
    else:
        raise SkillFormatError(f"line {number}: the value of {key!r} opens a {quote} quote "
                               "that is never closed")
    rest = text[i + 1:].strip()
    if rest and not rest.startswith("#"):
        raise SkillFormatError(f"line {number}: unexpected {rest!r} after the quoted value "
                               f"of {key!r}")
    inner = text[1:i]
    if quote == "'":
        return inner.replace("''", "'")
    try:
        return json.loads(f'"{inner}"')
    except json.JSONDecodeError as e:
        raise SkillFormatError(f"line {number}: the double-quoted value of {key!r} has an "
                               f"invalid escape ({e.msg}); use single quotes for backslashes"
                               ) from None


# ---------------------------------------------------------------------- skills and scanning


@dataclass(frozen=True)
class Skill:
    """One skill the model can read: ``name``, ``description``, where it comes from
    (``source``: ``builtin``, ``installed`` or ``workspace``) and its ``SKILL.md``."""

    name: str
    description: str
    source: Source
    path: Path

    @property
    def directory(self) -> Path:
        """The skill's directory: the files ``ReadSkill`` may read are inside it."""
        return self.path.parent

    @property
    def key(self) -> str:
        """The name as compared: ``PDF`` and ``pdf`` are one skill."""
        return _key(self.name)

    def listing(self) -> dict[str, str]:
        """This skill as ``ListSkills`` serves it."""
        return {"name": self.name, "description": self.description, "source": self.source}


@dataclass(frozen=True)
class IgnoredSkill:
    """A ``SKILL.md`` (or a directory) found but not served, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class SkillIndex:
    """The skills resolved from disk at one moment, in the order ``ListSkills`` gives them,
    and every ``SKILL.md`` left out (malformed, shadowed, duplicate) with the reason."""

    skills: tuple[Skill, ...] = ()
    ignored: tuple[IgnoredSkill, ...] = ()
    _by_key: dict[str, Skill] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_key.update((s.key, s) for s in self.skills)

    def get(self, name: str) -> Skill | None:
        """The skill of that name (compared as ``Skill.key``), or None."""
        return self._by_key.get(_key(name)) if isinstance(name, str) else None

    def listing(self) -> list[dict[str, str]]:
        """Exactly what ``ListSkills`` returns."""
        return [s.listing() for s in self.skills]


def _key(name: str) -> str:
    return unicodedata.normalize("NFKC", " ".join(name.split())).casefold()


def _scan(root: Path, source: Source) -> tuple[list[Skill], list[IgnoredSkill]]:
    """Every well-formed skill beneath ``root`` (first by path order wins a duplicate)."""
    skills: list[Skill] = []
    ignored: list[IgnoredSkill] = []
    if not root.is_dir():
        ignored.append(IgnoredSkill(root, "the skills directory does not exist (any more)"))
        return skills, ignored
    real_root = root.resolve()
    seen: dict[str, Skill] = {}
    for path in _skill_files(root, ignored):
        if path.is_symlink() and not path.resolve().is_relative_to(real_root):
            ignored.append(IgnoredSkill(path, "SKILL.md is a symlink leading out of the "
                                              f"skills directory {str(root)!r}"))
            continue
        try:
            fields = _read_frontmatter(path)
        except SkillFormatError as e:
            ignored.append(IgnoredSkill(path, f"malformed SKILL.md: {e}"))
            continue
        except OSError as e:
            ignored.append(IgnoredSkill(path, f"unreadable: {e.strerror or e}"))
            continue
        skill = Skill(fields["name"], fields["description"], source, path)
        first = seen.get(skill.key)
        if first is not None:
            ignored.append(IgnoredSkill(path, f"a second skill named {skill.name!r} in the "
                                              f"same directory; {str(first.path)!r} is used"))
            continue
        seen[skill.key] = skill
        skills.append(skill)
    return skills, ignored


def _skill_files(root: Path, ignored: list[IgnoredSkill]) -> Iterator[Path]:
    visited = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        visited += 1
        if visited > _MAX_DIRS:
            ignored.append(IgnoredSkill(root, f"the tree has more than {_MAX_DIRS} "
                                              "directories; the scan stopped there"))
            return
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        if SKILL_FILE in filenames:
            yield Path(dirpath) / SKILL_FILE


def _read_frontmatter(path: Path) -> dict[str, str]:
    with path.open("rb") as f:
        data = f.read(_HEAD_BYTES + 1)
    cut = len(data) > _HEAD_BYTES
    data = data[:_HEAD_BYTES]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (cut and e.start >= len(data) - 3):
            raise SkillFormatError(f"it is not UTF-8 text (byte {e.start})") from None
        text = data[:e.start].decode("utf-8")
    try:
        fields, _ = parse_skill_md(text)
    except SkillFormatError as e:
        if cut and "not closed" in str(e):
            raise SkillFormatError(f"the frontmatter does not end within the first "
                                   f"{_HEAD_BYTES // 1024} KiB") from None
        raise
    return fields


@functools.lru_cache(maxsize=1)
def _builtins() -> tuple[tuple[Skill, ...], tuple[IgnoredSkill, ...]]:
    skills, ignored = _scan(BUILTIN_DIRECTORY, "builtin")
    for item in ignored:  # our own files: a broken one is a bug, said loudly
        LOGGER.error("built-in skill %s is not served: %s", item.path, item.reason)
    return tuple(sorted(skills, key=lambda s: s.key)), tuple(ignored)


def _directory(directory: str | os.PathLike[str], what: str) -> Path:
    if isinstance(directory, bytes) or not isinstance(directory, str | os.PathLike):
        raise TypeError(f"{what}: give a directory path, got {type(directory).__name__}")
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise SkillError(f"{what}: {str(directory)!r} is not a directory (skills are "
                         f"directories holding a {SKILL_FILE}, anywhere beneath the one given)")
    return path.resolve()


@dataclass(frozen=True)
class Skills:
    """Where the skills of a conversation come from: the built-ins, then ``installed``
    directories (``with_skills``), then ``workspace`` directories; see the module doc for
    precedence. A value: reading the directories happens in ``scan`` and ``open``."""

    installed: tuple[Path, ...] = ()
    workspace: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        for name in ("installed", "workspace"):
            value = getattr(self, name)
            if isinstance(value, str | os.PathLike):
                raise TypeError(f"Skills({name}=...) takes a sequence of directories, got one "
                                f"path: write {name}=({str(value)!r},)")
            paths = tuple(Path(p).expanduser().absolute() for p in value)
            object.__setattr__(self, name, tuple(dict.fromkeys(paths)))

    def with_skills(self, directory: str | os.PathLike[str]) -> Skills:
        """These skills plus those beneath ``directory``, installed last (so they win over
        earlier installations). Raises ``SkillError`` if it is not a directory."""
        path = _directory(directory, "with_skills")
        kept = tuple(p for p in self.installed if p != path)
        return Skills((*kept, path), self.workspace)

    def with_workspace_directory(self, directory: str | os.PathLike[str]) -> Skills:
        """These skills plus those discovered beneath a workspace directory (the lowest
        precedence). Raises ``SkillError`` if it is not a directory."""
        path = _directory(directory, "with_workspace_directory")
        kept = tuple(p for p in self.workspace if p != path)
        return Skills(self.installed, (*kept, path))

    def scan(self) -> SkillIndex:
        """Read the directories now and resolve precedence (blocking file IO)."""
        builtin, ignored_builtin = _builtins()
        chosen: dict[str, Skill] = {s.key: s for s in builtin}
        ignored: list[IgnoredSkill] = list(ignored_builtin)
        layers: list[tuple[Source, Path]] = [("installed", p) for p in self.installed]
        layers += [("workspace", p) for p in self.workspace]
        for source, root in layers:
            found, skipped = _scan(root, source)
            ignored += skipped
            for skill in found:
                held = chosen.get(skill.key)
                if held is None:
                    chosen[skill.key] = skill
                elif held.source == "builtin":
                    ignored.append(IgnoredSkill(skill.path, f"{skill.name!r} is the name of a "
                                                "built-in skill, which cannot be shadowed: "
                                                "rename this one"))
                elif source == "installed":  # a later installation wins
                    ignored.append(IgnoredSkill(held.path, f"{held.name!r} is overridden by "
                                                f"{str(skill.path)!r}, installed later"))
                    del chosen[skill.key]
                    chosen[skill.key] = skill
                else:
                    ignored.append(IgnoredSkill(skill.path, f"{skill.name!r} is already "
                                                f"provided by {str(held.path)!r} ({held.source})"))
        for item in ignored[len(ignored_builtin):]:
            LOGGER.warning("skill %s is not served: %s", item.path, item.reason)
        order = {"builtin": 0, "installed": 1, "workspace": 2}
        skills = sorted(chosen.values(), key=lambda s: order[s.source])  # stable: layer order
        return SkillIndex(tuple(skills), tuple(ignored))

    @property
    def skills(self) -> tuple[Skill, ...]:
        """The skills the model sees, as ``ListSkills`` serves them (reads the disk now)."""
        return self.scan().skills

    async def open(self) -> SkillsToolset:
        """Scan (in a worker thread) and return the toolset offering ``ListSkills`` and
        ``ReadSkill`` over that snapshot. Nothing to close but the toolset itself."""
        return SkillsToolset(await anyio.to_thread.run_sync(self.scan))

    def to_json(self) -> dict[str, Any]:
        """The directories by absolute path; ``from_json`` rebuilds an equal value."""
        return {"installed": [str(p) for p in self.installed],
                "workspace": [str(p) for p in self.workspace]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> Skills:
        """The value ``to_json`` gave (a dict or its JSON text). The directories need not
        exist yet: a missing one is reported by ``scan``."""
        if isinstance(data, str | bytes):
            data = json.loads(data)
        if not isinstance(data, Mapping):
            raise TypeError(f"Skills in JSON are an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"installed", "workspace"})
        if unknown:
            raise ValueError(f"Skills in JSON have unknown keys {unknown}")
        return cls(tuple(_strings(data.get("installed"), "installed")),
                   tuple(_strings(data.get("workspace"), "workspace")))


def _strings(value: Any, key: str) -> Iterable[str]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"Skills in JSON: {key!r} is a list of directory paths")
    return value


# ---------------------------------------------------------------------- the toolset


class SkillsToolset:
    """``ListSkills`` and ``ReadSkill`` over one ``SkillIndex``: a ``Toolset``."""

    name = "skills"

    def __init__(self, index: SkillIndex) -> None:
        self.index = index
        self._closed = False
        self._tools = [
            Tool(name=LIST_SKILLS,
                 description="List the skills available: instructions for particular tasks, "
                             "each with a name, a description saying when to use it, and its "
                             "source. Read one with ReadSkill before doing a task it covers.",
                 input_schema={"type": "object", "properties": {},
                               "additionalProperties": False}),
            Tool(name=READ_SKILL,
                 description="Read a skill's instructions (its SKILL.md), or with 'path' a "
                             "file inside the skill's directory that the instructions mention. "
                             f"At most {MAX_READ_CHARS} characters per call: pass 'offset' to "
                             "read on.",
                 input_schema={
                     "type": "object",
                     "properties": {
                         "name": {"type": "string",
                                  "description": "The skill's name, as ListSkills gives it."},
                         "path": {"type": "string",
                                  "description": "A file (or folder) inside the skill's "
                                                 "directory, relative to it, e.g. "
                                                 "'reference.md'. Omit it for SKILL.md."},
                         "offset": {"type": "integer", "minimum": 0,
                                    "description": "The character to start at (default 0)."},
                     },
                     "required": ["name"],
                     "additionalProperties": False,
                 }),
        ]

    @property
    def skills(self) -> tuple[Skill, ...]:
        return self.index.skills

    async def list_tools(self) -> list[Tool]:
        return list(self._tools)

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutput:
        if self._closed:
            raise ToolError("The skills are closed for this conversation.")
        if name == LIST_SKILLS:
            return self.index.listing()
        if name == READ_SKILL:
            skill_name = arguments.get("name")
            path = arguments.get("path") or None
            offset = arguments.get("offset") or 0
            return await anyio.to_thread.run_sync(self.read, skill_name, path, offset)
        raise ToolError(f"The skills toolset has no tool {name!r}; its tools are "
                        f"{LIST_SKILLS!r} and {READ_SKILL!r}.")

    def read(self, name: Any, path: str | None = None, offset: int = 0) -> str:
        """What ``ReadSkill`` answers (blocking file IO). Raises ``ToolError``."""
        skill = self.index.get(name) if isinstance(name, str) else None
        if skill is None:
            names = ", ".join(repr(s.name) for s in self.index.skills) or "none"
            raise ToolError(f"There is no skill {name!r}. The skills are: {names} "
                            f"(call {LIST_SKILLS} for their descriptions).")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ToolError(f"offset must be a non-negative integer, got {offset!r}.")
        if path is None or path == SKILL_FILE:
            return self._read_body(skill, offset)
        target = _inside(skill, path)
        if target.is_dir():
            return _listing_text(skill, target)
        text, note = _read_text(target, f"{path!r} in skill {skill.name!r}")
        return _page(text, offset, note, skill, path)

    def _read_body(self, skill: Skill, offset: int) -> str:
        text, note = _read_text(skill.path, f"the SKILL.md of {skill.name!r}")
        try:
            _, body = parse_skill_md(text)
        except SkillFormatError as e:  # changed on disk since the scan
            raise ToolError(f"The SKILL.md of {skill.name!r} is malformed now: {e}.") from None
        files = [f for f in _files(skill.directory, skill.directory) if f != SKILL_FILE]
        if files:  # what the body may point to, so the model knows what it can read
            body += "\n\n" + _listing_text(skill, skill.directory, files)
        return _page(body, offset, note, skill, None)

    async def aclose(self) -> None:
        self._closed = True


def _inside(skill: Skill, path: Any) -> Path:
    """``path`` resolved inside the skill's directory, or a ToolError saying why not."""
    where = f"skill {skill.name!r}"
    if not isinstance(path, str) or "\0" in path:
        raise ToolError(f"path must be a relative file path inside {where}, got {path!r}.")
    posix = path.replace("\\", "/")
    if posix.startswith("/") or re.match(r"[A-Za-z]:", posix) or posix.startswith("~"):
        raise ToolError(f"{path!r} is an absolute path: give a path relative to the directory "
                        f"of {where}, e.g. 'reference.md'.")
    if ".." in PurePosixPath(posix).parts:
        raise ToolError(f"{path!r} contains '..': only files inside the directory of {where} "
                        "can be read.")
    base = skill.directory.resolve()
    target = (base / posix).resolve()
    if not target.is_relative_to(base):
        raise ToolError(f"{path!r} leads out of the directory of {where} (through a symlink): "
                        "only files inside it can be read.")
    if not target.exists():
        files = _files(skill.directory, skill.directory)
        shown = ", ".join(repr(f) for f in files[:20]) or "none"
        raise ToolError(f"There is no file {path!r} in {where}. Its files: {shown}.")
    if not (target.is_file() or target.is_dir()):
        raise ToolError(f"{path!r} in {where} is not a regular file.")
    return target


def _files(directory: Path, skill_dir: Path) -> list[str]:
    """Files beneath ``directory`` relative to the skill's directory, sorted, capped."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            rel = (Path(dirpath) / name).relative_to(skill_dir).as_posix()
            out.append(rel)
            if len(out) > _MAX_LISTED_FILES:
                return out
    return out


def _listing_text(skill: Skill, directory: Path, files: list[str] | None = None) -> str:
    files = files if files is not None else _files(directory, skill.directory)
    files = [f for f in files if f != SKILL_FILE]
    more = ""
    if len(files) > _MAX_LISTED_FILES:
        files, more = files[:_MAX_LISTED_FILES], "\n- ... (more files not listed)"
    lines = "\n".join(f"- {f}" for f in files) or "(no files)"
    return (f"Files in skill {skill.name!r} (read one with {READ_SKILL}, "
            f"name={skill.name!r}, path=<file>):\n{lines}{more}")


def _read_text(path: Path, what: str) -> tuple[str, str]:
    """The text of a file (up to MAX_FILE_BYTES) and a note if it was cut there."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES)
    except OSError as e:
        raise ToolError(f"Cannot read {what}: {e.strerror or e}.") from None
    if b"\0" in data[:8192]:
        raise ToolError(f"{what} is a binary file ({size} bytes): {READ_SKILL} shows text only.")
    note = (f" The file has {size} bytes; only the first {MAX_FILE_BYTES} can be read."
            if size > MAX_FILE_BYTES else "")
    return data.decode("utf-8", errors="replace"), note


def _page(text: str, offset: int, note: str, skill: Skill, path: str | None) -> str:
    if offset and offset >= len(text):
        raise ToolError(f"offset {offset} is past the end: the text has {len(text)} characters.")
    end = min(offset + MAX_READ_CHARS, len(text))
    piece = text[offset:end]
    if end < len(text) or note:
        where = f"name={skill.name!r}" + (f", path={path!r}" if path else "")
        piece += (f"\n\n[... truncated: characters {offset}-{end} of {len(text)} shown. Call "
                  f"{READ_SKILL} with {where}, offset={end} to read on.{note}]"
                  if end < len(text) else f"\n\n[...{note}]")
    return piece
