"""External MCP servers as a source of tools for the conversation object.

``MCPServer`` is the *spec* of a server: an immutable, hashable, JSON-serialisable value
(``name``, ``command``, ``args``, ``env``, timeouts) that ``LLM.with_mcp_server`` stores and
``portable_id`` carries "by command". Nothing runs until it is opened; opening starts the
process over stdio through the official ``mcp`` SDK (``stdio_client`` + ``ClientSession``),
initialises the session within ``init_timeout`` and returns an ``MCPToolset``::

    async with anyio.create_task_group() as tg:          # owned by the caller
        toolset = await server.open(tg)                  # the process runs in a task of tg
        try:
            tools = await toolset.list_tools()
            text = await toolset.call("echo", {"text": "hi"})
        finally:
            await toolset.aclose()                       # returns once the process is gone

    async with server.connect() as toolset:              # the same, one block
        ...

Why a task group: the SDK's context managers hold anyio cancel scopes and must be entered and
exited by one task, in order. ``open`` therefore runs them in a dedicated task of the caller's
task group, so the caller may open lazily from anywhere inside that group (inside a step, under
its own ``fail_after``) without interleaving cancel scopes. The process is gone when
``aclose()`` returns, and also when the task group is cancelled or fails (the SDK's shielded
shutdown: close stdin, then SIGTERM, then SIGKILL, each bounded). A server that dies on its own
never fails the caller's task group: its calls become error results.

Tool names: ``list_tools`` gives the server's own names (no prefix), except that a name no
model provider accepts (outside ``[A-Za-z0-9_-]{1,64}``, e.g. ``files.read``) is listed with the
other characters replaced by ``_`` (``files_read``, made unique with ``_2``...); ``call`` takes the
listed name. A caller that binds several sources prefixes on clash with ``toolset.name``, which
is the spec's ``name`` and therefore itself a valid tool-name fragment.

Results: the text contents of an MCP result joined by newlines; other content described
(``[image: image/png, 16 bytes]``, resources by URI, embedded text resources inlined); only
structured content is sent as JSON; no content at all is ``(no output)``. Results longer than
``MAX_RESULT_CHARS`` are cut and say so. A result with ``isError`` raises ``ToolError`` with its
text, as do protocol errors, timeouts (``call_timeout``) and a server that died.

Secrets: ``env`` values are never shown: not in ``repr``, errors or logs (an error quoting the
server's stderr has every env value of 4+ characters replaced by ``***``). ``to_json`` does
include them, since a restored conversation needs them: treat a ``portable_id`` of a
conversation with such a server as a secret. The process gets the SDK's safe default
environment (``HOME``, ``PATH``, ``USER``...) plus ``env``; its stderr goes to a temporary file
whose tail is quoted when the server fails to start or dies.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, TextIO, cast

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..errors import CelldialogError
from ..llm.steps import ToolError, ToolOutput
from ..llm.types import Tool

if TYPE_CHECKING:  # the SDK is imported on first use: importing it costs a second
    from mcp import types as mcp_types

__all__ = [
    "DEFAULT_INIT_TIMEOUT",
    "MAX_RESULT_CHARS",
    "MCPServer",
    "MCPServerError",
    "MCPToolset",
]

LOGGER = logging.getLogger("celldialog.conversation.mcp")

DEFAULT_INIT_TIMEOUT = 30.0
"""Seconds a server has to start and answer the MCP initialisation (and each tool listing)."""

MAX_RESULT_CHARS = 100_000
"""The most of one tool result sent to the model; a longer one is cut and says so."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what every provider accepts as a tool name
_STDERR_TAIL = 2000  # bytes of the server's stderr quoted in an error
_MAX_PAGES = 1000  # tools/list pages followed before giving up on a server that never ends
_SECRET_MIN = 4  # env values shorter than this are too common to redact from text


class MCPServerError(CelldialogError, RuntimeError):
    """An MCP server could not be started, initialised or listed. The message names the
    server and its command line, never its environment."""


class _Env(Mapping[str, str]):
    """An immutable, hashable environment whose repr hides the values (they may be secrets)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str]) -> None:
        self._items = dict(sorted(items.items()))

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(other.items()) == self._items

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: '***'" for k in self._items) + "}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Env, (self._items,))


@dataclass(frozen=True, repr=False)
class MCPServer:
    """How to run one MCP server over stdio: a value, nothing runs until ``open``.

    ``name`` identifies the server in a conversation (errors, tool-name prefixes on clash), so
    it must be 1-64 of ``[A-Za-z0-9_-]``. ``args`` are passed as is (no shell). ``env`` is added
    to the SDK's safe default environment; its values are secret-safe (see the module doc).
    ``init_timeout`` bounds the start and initialisation (and each tool listing);
    ``call_timeout`` bounds one tool call (None: no limit but the conversation's own).
    """

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    init_timeout: float = DEFAULT_INIT_TIMEOUT
    call_timeout: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"MCP server name {self.name!r} is not usable: give 1-64 letters, digits, '_' or "
                "'-' (it prefixes the server's tool names when they clash), e.g. 'github'"
            )
        if not isinstance(self.command, str) or not self.command.strip() or "\0" in self.command:
            raise ValueError(
                f"MCP server {self.name!r}: command must be the executable to run, a non-empty "
                f"string, got {self.command!r}"
            )
        if isinstance(self.args, str):
            raise TypeError(
                f"MCP server {self.name!r}: args must be a sequence of strings, got the string "
                f"{self.args!r}; write args=({self.args!r},) or split it with shlex.split"
            )
        args = tuple(self.args)
        bad = [a for a in args if not isinstance(a, str) or "\0" in a]
        if bad:
            raise TypeError(
                f"MCP server {self.name!r}: every arg must be a string without NUL bytes, got "
                f"{bad[0]!r}"
            )
        object.__setattr__(self, "args", args)
        if self.env is not None:
            if not isinstance(self.env, Mapping):
                raise TypeError(
                    f"MCP server {self.name!r}: env must be a mapping of variable names to "
                    f"values, got {type(self.env).__name__}"
                )
            for key, value in self.env.items():
                if not isinstance(key, str) or not key or "=" in key or "\0" in key:
                    raise ValueError(
                        f"MCP server {self.name!r}: env has an invalid variable name {key!r}"
                    )
                if not isinstance(value, str) or "\0" in value:
                    raise TypeError(  # the value itself is not quoted: it may be a secret
                        f"MCP server {self.name!r}: the value of env[{key!r}] must be a string "
                        "without NUL bytes"
                    )
            object.__setattr__(self, "env", _Env(self.env))
        if not _positive(self.init_timeout):
            raise ValueError(
                f"MCP server {self.name!r}: init_timeout must be a positive number of seconds, "
                f"got {self.init_timeout!r}"
            )
        if self.call_timeout is not None and not _positive(self.call_timeout):
            raise ValueError(
                f"MCP server {self.name!r}: call_timeout must be None or a positive number of "
                f"seconds, got {self.call_timeout!r}"
            )

    def __repr__(self) -> str:
        parts = [f"name={self.name!r}", f"command={self.command!r}"]
        if self.args:
            parts.append(f"args={self.args!r}")
        if self.env is not None:
            parts.append(f"env={self.env!r}")
        if self.init_timeout != DEFAULT_INIT_TIMEOUT:
            parts.append(f"init_timeout={self.init_timeout!r}")
        if self.call_timeout is not None:
            parts.append(f"call_timeout={self.call_timeout!r}")
        return f"MCPServer({', '.join(parts)})"

    @property
    def command_line(self) -> str:
        """The command and its args as a shell would show them (env not included)."""
        return self.redact(shlex.join((self.command, *self.args)))

    def redact(self, text: str) -> str:
        """``text`` with every env value (of 4+ characters) replaced by ``***``."""
        for value in sorted((self.env or {}).values(), key=len, reverse=True):
            if len(value) >= _SECRET_MIN:
                text = text.replace(value, "***")
        return text

    # ------------------------------------------------------------------ serialisation

    def to_json(self) -> dict[str, Any]:
        """A JSON-compatible dict that ``from_json`` turns back into an equal spec. It holds
        the env values: keep it (and any ``portable_id`` carrying it) as secret as they are."""
        return {
            "name": self.name,
            "command": self.command,
            "args": list(self.args),
            "env": dict(self.env) if self.env is not None else None,
            "init_timeout": self.init_timeout,
            "call_timeout": self.call_timeout,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> MCPServer:
        """The spec ``to_json`` gave (a dict, or its JSON text). Unknown keys are refused."""
        if isinstance(data, str | bytes):
            data = json.loads(data)
        if not isinstance(data, Mapping):
            raise TypeError(f"an MCPServer in JSON is an object, got {type(data).__name__}")
        known = {"name", "command", "args", "env", "init_timeout", "call_timeout"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"an MCPServer in JSON has unknown keys {unknown}; known: "
                             f"{sorted(known)}")
        missing = [k for k in ("name", "command") if k not in data]
        if missing:
            raise ValueError(f"an MCPServer in JSON needs {missing}")
        args = data.get("args") or ()
        if not isinstance(args, list | tuple):
            raise TypeError(f"an MCPServer's args in JSON are a list, got {type(args).__name__}")
        return cls(
            name=data["name"],
            command=data["command"],
            args=tuple(args),
            env=data.get("env"),
            init_timeout=data.get("init_timeout", DEFAULT_INIT_TIMEOUT),
            call_timeout=data.get("call_timeout"),
        )

    # ------------------------------------------------------------------ running

    async def open(self, task_group: TaskGroup) -> MCPToolset:
        """Start the server in a new task of ``task_group`` and return its open toolset once
        the MCP session is initialised. Close it with ``await toolset.aclose()``; cancelling
        or failing ``task_group`` closes it too. Raises ``MCPServerError`` (naming the server
        and its command) if the process cannot start, exits, or does not initialise within
        ``init_timeout``; the process is gone by then."""
        toolset = MCPToolset(self)
        LOGGER.debug("starting MCP server %r: %s", self.name, self.command_line)
        return cast(MCPToolset, await task_group.start(
            self._serve, toolset, name=f"MCP server {self.name}"))

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[MCPToolset]:
        """``async with server.connect() as toolset``: ``open`` in a task group of its own,
        closed when the block exits, however it exits (the process is gone after it). An
        exception from the block propagates unchanged (not wrapped in an ExceptionGroup)."""
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            try:
                toolset = await self.open(tg)
            except Exception as e:  # re-raised below, outside the group, as is
                error = e
            else:
                try:
                    yield toolset
                except Exception as e:  # the same
                    error = e
                finally:
                    await toolset.aclose()
        if error is not None:
            raise error

    async def _serve(self, toolset: MCPToolset, *,
                     task_status: TaskStatus[MCPToolset] = anyio.TASK_STATUS_IGNORED) -> None:
        """The task that owns the SDK's context managers, from start to shutdown."""
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=self.command, args=list(self.args),
            env=dict(self.env) if self.env is not None else None,
        )
        started = False
        with tempfile.TemporaryFile() as errlog:
            toolset._errlog = errlog
            try:
                async with stdio_client(params, errlog=cast(TextIO, errlog)) as (read, write):
                    async with ClientSession(read, write,
                                             message_handler=toolset._on_message) as session:
                        with anyio.fail_after(self.init_timeout):
                            await session.initialize()
                        toolset._session = session
                        started = True
                        LOGGER.debug("MCP server %r is ready", self.name)
                        task_status.started(toolset)
                        await toolset._stop.wait()
            except Exception as e:
                if not started:
                    leaf = _leaf(e)
                    raise self._start_error(leaf, _tail(errlog)) from leaf
                LOGGER.warning("MCP server %r (%s) failed: %s", self.name, self.command_line,
                               self.redact(_describe(_leaf(e))))
            finally:
                toolset._session = None
                toolset._closed = True
                toolset._errlog = None
                toolset._done.set()
                LOGGER.debug("MCP server %r stopped", self.name)

    def _start_error(self, error: BaseException, stderr: str) -> MCPServerError:
        from mcp.shared.exceptions import MCPError

        head = f"MCP server {self.name!r} ({self.command_line})"
        if isinstance(error, FileNotFoundError):
            text = (f"{head} could not start: command {self.command!r} not found. Install it, "
                    "or give its full path (the server's PATH is this process's PATH)")
        elif isinstance(error, PermissionError):
            text = (f"{head} could not start: {self.command!r} is not executable (permission "
                    "denied). Check the file's mode, or run it through its interpreter")
        elif isinstance(error, TimeoutError):  # before OSError: it is one
            text = (f"{head} did not complete the MCP initialisation within "
                    f"{self.init_timeout:g}s: check that it is an MCP server speaking stdio, or "
                    "raise init_timeout if it is slow to start")
        elif isinstance(error, OSError):
            text = f"{head} could not start: {_describe(error)}"
        elif isinstance(error, MCPError):
            text = (f"{head} failed during the MCP initialisation: {error.message} (MCP error "
                    f"{error.code}); the process exited or is not an MCP server speaking stdio")
        else:
            text = f"{head} failed to start: {_describe(error)}"
        if stderr:
            text += f". Its stderr ends with:\n{stderr}"
        return MCPServerError(self.redact(text))


class MCPToolset:
    """The open session with one running MCP server: a ``Toolset`` (list_tools, call,
    aclose). Made by ``MCPServer.open`` / ``connect``, never directly."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self._session: Any = None
        self._closed = False
        self._stop = anyio.Event()
        self._done = anyio.Event()
        self._errlog: IO[bytes] | None = None
        self._listing: dict[str, tuple[Tool, str]] | None = None  # listed -> (tool, original)

    @property
    def name(self) -> str:
        """The server's name in the conversation (the spec's ``name``)."""
        return self.server.name

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called or the session ended."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<MCPToolset {self.name!r} {state}: {self.server.command_line}>"

    async def list_tools(self) -> list[Tool]:
        """The server's tools now, as port ``Tool``s (names as described in the module doc):
        asked of the server at each call (a stdio round trip), so a server whose tools change
        is seen as it is. Raises ``MCPServerError`` when the server is closed, dead or does not
        answer within ``init_timeout``."""
        listing = await self._list()
        return [tool for tool, _ in listing.values()]

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutput:
        """Call the tool listed as ``name``; the result's text (see the module doc). Raises
        ``ToolError`` for an error result, a protocol error, a timeout or a dead server."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        head = f"MCP server {self.name!r}"
        listing = self._listing
        try:
            if listing is None or name not in listing:  # not listed yet, or listed since
                listing = await self._list()
        except MCPServerError as e:
            raise ToolError(str(e)) from None
        entry = listing.get(name)
        if entry is None:
            known = {original: listed for listed, (_, original) in listing.items()}
            if name not in known:
                raise ToolError(f"{head} has no tool {name!r}; its tools are: "
                                f"{', '.join(repr(n) for n in listing) or 'none'}")
            entry = listing[known[name]]
        original = entry[1]
        session = self._session
        if session is None:
            raise ToolError(f"{head} is closed: tool {name!r} cannot run")
        try:
            result = await session.call_tool(original, dict(arguments),
                                             read_timeout_seconds=self.server.call_timeout)
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:
                raise ToolError(self.server.redact(
                    f"{head} stopped during the call to {original!r}: the process exited or "
                    f"closed its connection{self._stderr_note()}")) from None
            if e.code == REQUEST_TIMEOUT:
                raise ToolError(f"{head} did not answer the call to {original!r} within "
                                f"{self.server.call_timeout:g}s") from None
            raise ToolError(self.server.redact(
                f"{head} refused the call to {original!r}: {e.message} (MCP error {e.code})"
            )) from None
        text = _result_text(result)
        if result.is_error:
            raise ToolError(self.server.redact(text if text != _NO_OUTPUT else
                                               f"Tool {original!r} of {head} failed."))
        return text

    async def aclose(self) -> None:
        """Stop the server; returns once its process is gone. Idempotent, and it completes
        even when the caller is being cancelled (the SDK's shutdown is bounded)."""
        self._closed = True
        self._stop.set()
        with anyio.CancelScope(shield=True):
            await self._done.wait()

    # ------------------------------------------------------------------ internals

    async def _list(self) -> dict[str, tuple[Tool, str]]:
        """Ask the server for its tools; the mapping of listed names is kept for ``call``."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import PaginatedRequestParams

        session = self._session
        head = f"MCP server {self.name!r} ({self.server.command_line})"
        if session is None:
            raise MCPServerError(f"{head} is closed: its tools cannot be listed")
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self.server.init_timeout):
                for _ in range(_MAX_PAGES):
                    params = PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except TimeoutError:
            raise MCPServerError(f"{head} did not list its tools within "
                                 f"{self.server.init_timeout:g}s") from None
        except MCPError as e:
            raise MCPServerError(self.server.redact(
                f"{head} could not list its tools: {e.message} (MCP error {e.code})"
                f"{self._stderr_note()}")) from None
        listing = _listing(tools)
        self._listing = listing
        return listing

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            LOGGER.debug("MCP server %r sent something unreadable: %s", self.name,
                         self.server.redact(_describe(message)))

    def _stderr_note(self) -> str:
        tail = _tail(self._errlog) if self._errlog is not None else ""
        return f". Its stderr ends with:\n{tail}" if tail else ""


# ---------------------------------------------------------------------- helpers

_NO_OUTPUT = "(no output)"


def _positive(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _describe(e: BaseException) -> str:
    text = str(e)
    return type(e).__name__ + (f": {text}" if text else "")


def _leaf(e: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, for a readable message."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = next((x for x in e.exceptions if not isinstance(x, anyio.get_cancelled_exc_class())),
                 e.exceptions[0])
    return e


def _tail(errlog: IO[bytes]) -> str:
    """The end of the server's stderr, read without moving the offset the child writes at."""
    try:
        fd = errlog.fileno()
        size = os.fstat(fd).st_size
        start = max(size - _STDERR_TAIL, 0)
        data = os.pread(fd, size - start, start)
    except (OSError, ValueError, AttributeError):
        return ""
    text = data.decode("utf-8", errors="replace").strip()
    return ("..." + text) if start else text


def _listing(tools: list[mcp_types.Tool]) -> dict[str, tuple[Tool, str]]:
    """Listed name -> (port Tool, server's name). Valid names are kept as they are and win;
    the others are sanitised and made unique."""
    taken = {t.name for t in tools if _NAME.fullmatch(t.name)}
    listed_names: list[str] = []
    for t in tools:
        if _NAME.fullmatch(t.name):
            listed_names.append(t.name)
            continue
        base = re.sub(r"[^A-Za-z0-9_-]", "_", t.name)[:64] or "tool"
        candidate, n = base, 2
        while candidate in taken:
            suffix = f"_{n}"
            candidate, n = base[: 64 - len(suffix)] + suffix, n + 1
        taken.add(candidate)
        listed_names.append(candidate)
    listing: dict[str, tuple[Tool, str]] = {}
    for listed, t in zip(listed_names, tools, strict=True):
        if listed in listing:  # a server listing one name twice: the first wins
            continue
        schema = t.input_schema if isinstance(t.input_schema, dict) else {}
        if schema.get("type") != "object":  # MCP requires it; the port's Tool expects it
            schema = {**schema, "type": "object"}
        description = t.description or t.title or ""
        listing[listed] = (Tool(name=listed, description=description, input_schema=schema),
                           t.name)
    return listing


def _result_text(result: mcp_types.CallToolResult) -> str:
    from mcp.types import (
        AudioContent,
        BlobResourceContents,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
    )

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent | AudioContent):
            kind = "image" if isinstance(block, ImageContent) else "audio"
            parts.append(f"[{kind}: {block.mime_type}, {_b64_size(block.data)} bytes]")
        elif isinstance(block, ResourceLink):
            about = f": {block.description}" if block.description else ""
            parts.append(f"[resource link {block.name!r} <{block.uri}>{about}]")
        elif isinstance(block, EmbeddedResource):
            res = block.resource
            if isinstance(res, BlobResourceContents):
                mime = res.mime_type or "application/octet-stream"
                parts.append(f"[resource <{res.uri}>: {mime}, {_b64_size(res.blob)} bytes]")
            else:
                parts.append(f"[resource <{res.uri}>]\n{res.text}")
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    if parts:
        text = "\n".join(parts)
    elif result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"))
    else:
        return _NO_OUTPUT
    if len(text) > MAX_RESULT_CHARS:
        text = (text[:MAX_RESULT_CHARS] + f"\n[... truncated: the result has {len(text)} "
                f"characters, the first {MAX_RESULT_CHARS} are shown]")
    return text


def _b64_size(data: str) -> int:
    data = data.strip()
    return max(len(data) * 3 // 4 - data[-2:].count("="), 0)
