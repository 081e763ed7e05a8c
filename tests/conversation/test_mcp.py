"""MCP servers as tools: the spec value, and a real stdio server process (mcp_echo_server.py,
written with the SDK) listed, called, failing, and always gone after close, cancellation or an
exception."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import pickle
import sys
from pathlib import Path

import anyio
import pytest

from runtime.conversation.mcp import (
    MAX_RESULT_CHARS,
    MCPServer,
    MCPServerError,
    MCPToolset,
)
from runtime.conversation.toolset import Toolset
from runtime.llm.steps import ToolError

pytestmark = pytest.mark.anyio

SERVER = str(Path(__file__).with_name("mcp_echo_server.py"))
SECRET = "s3cr3t-token-value"
LIMIT = 30  # seconds: a bound on each test's awaits, far above what they need (~3s)


def echo(*mode: str, **kw) -> MCPServer:
    return MCPServer("echo", sys.executable, (SERVER, *mode), **kw)


def gone(pid: int) -> bool:
    """True if no process ``pid`` exists (the SDK reaps the child before close returns, so a
    zombie counts as alive here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def server_pid(toolset: MCPToolset) -> int:
    pid = int(await toolset.call("pid", {}))
    assert not gone(pid)
    return pid


# ---------------------------------------------------------------------- the spec


def test_spec_hides_env_values_in_repr_and_str() -> None:
    server = MCPServer("gh", "npx", ("-y", "server-github"), env={"GITHUB_TOKEN": SECRET})
    for text in (repr(server), str(server), repr(server.env), server.command_line):
        assert SECRET not in text
    assert "GITHUB_TOKEN" in repr(server)
    assert server.command_line == "npx -y server-github"


def test_spec_round_trips_through_json_and_is_hashable() -> None:
    server = MCPServer("gh", "npx", ("-y", "x y"), env={"B": "2", "A": "1"},
                       init_timeout=5, call_timeout=9.5)
    data = json.loads(json.dumps(server.to_json()))
    again = MCPServer.from_json(data)
    assert again == server and hash(again) == hash(server)
    assert MCPServer.from_json(json.dumps(data)) == server
    assert again.env == {"A": "1", "B": "2"} and again.args == ("-y", "x y")
    assert {server: 1}[again] == 1
    bare = MCPServer("x", "cmd")
    assert MCPServer.from_json(bare.to_json()) == bare and bare.env is None
    assert copy.deepcopy(server) == server == pickle.loads(pickle.dumps(server))
    assert SECRET not in repr(dataclasses.replace(server, env={"K": SECRET}))


def test_spec_refuses_bad_values_clearly_without_quoting_secrets() -> None:
    with pytest.raises(ValueError, match="name 'my server' is not usable"):
        MCPServer("my server", "cmd")
    with pytest.raises(TypeError, match=r"args=\('--stdio',\)"):
        MCPServer("x", "cmd", "--stdio")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="command must be"):
        MCPServer("x", "  ")
    with pytest.raises(ValueError, match="init_timeout"):
        MCPServer("x", "cmd", init_timeout=0)
    with pytest.raises(TypeError, match=r"env\['TOKEN'\]") as info:
        MCPServer("x", "cmd", env={"TOKEN": SECRET.encode()})  # type: ignore[dict-item]
    assert SECRET not in str(info.value)
    with pytest.raises(ValueError, match=r"unknown keys.*'environment'"):
        MCPServer.from_json({"name": "x", "command": "c", "environment": {}})
    with pytest.raises(ValueError, match=r"needs.*'command'"):
        MCPServer.from_json({"name": "x"})
    with pytest.raises(AttributeError):
        bare = MCPServer("x", "cmd")
        bare.name = "y"  # type: ignore[misc]


# ---------------------------------------------------------------------- a real server


async def test_lists_the_servers_tools_under_provider_safe_names() -> None:
    with anyio.fail_after(LIMIT):
        async with echo().connect() as toolset:
            assert isinstance(toolset, Toolset)
            assert toolset.name == "echo" and not toolset.closed
            tools = {t.name: t for t in await toolset.list_tools()}
            assert await toolset.call("grow", {"name": "grown"}) == "added grown"
            grown = {t.name for t in await toolset.list_tools()}  # asked again: fresh
            assert await toolset.call("grown", {"text": "new"}) == "new"
    assert grown == set(tools) | {"grown"}
    assert {"echo", "add", "fail", "pid", "env", "image", "big", "sleep", "crash",
            "files_read", "grow"} == set(tools)
    assert tools["add"].description == "Add two integers."
    assert tools["add"].input_schema["type"] == "object"
    assert set(tools["add"].input_schema["required"]) == {"a", "b"}
    assert tools["files_read"].input_schema["required"] == ["path"]
    assert toolset.closed


async def test_calls_tools_and_turns_results_into_text() -> None:
    with anyio.fail_after(LIMIT):
        async with echo(env={"ECHO_SECRET": SECRET}).connect() as toolset:
            assert await toolset.call("echo", {"text": "héllo ✓"}) == "héllo ✓"
            assert await toolset.call("add", {"a": 2, "b": 40}) == "42"
            # a listed (sanitised) name reaches the server's own name
            assert await toolset.call("files_read", {"path": "a.txt"}) == "contents of a.txt"
            # env reaches the process (and so must stay out of errors, tested below)
            assert await toolset.call("env", {"name": "ECHO_SECRET"}) == SECRET
            assert await toolset.call("image", {}) == "[image: image/png, 16 bytes]"
            big = await toolset.call("big", {"chars": MAX_RESULT_CHARS + 5})
    assert big.startswith("x" * MAX_RESULT_CHARS + "\n[... truncated")
    assert f"has {MAX_RESULT_CHARS + 5} characters" in big


async def test_error_results_and_bad_calls_raise_tool_error() -> None:
    with anyio.fail_after(LIMIT):
        async with echo().connect() as toolset:
            with pytest.raises(ToolError, match="no milk today"):
                await toolset.call("fail", {"message": "no milk today"})
            with pytest.raises(ToolError, match=r"has no tool 'nope'.*'echo'"):
                await toolset.call("nope", {})
            with pytest.raises(ToolError, match="validation error"):
                await toolset.call("add", {"a": "many"})
            # the session survives error results
            assert await toolset.call("echo", {"text": "still here"}) == "still here"


async def test_aclose_stops_the_process_and_is_idempotent() -> None:
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            toolset = await echo().open(tg)
            pid = await server_pid(toolset)
            await toolset.aclose()
            assert gone(pid), "the server process outlived aclose()"
            await toolset.aclose()
            assert toolset.closed
            with pytest.raises(ToolError, match="closed"):
                await toolset.call("echo", {"text": "x"})


async def test_process_is_gone_when_the_callers_scope_is_cancelled() -> None:
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            toolset = await echo().open(tg)
            pid = await server_pid(toolset)
            tg.cancel_scope.cancel()  # the conversation's loop is cancelled: nobody calls aclose
    assert gone(pid)
    assert toolset.closed


async def test_process_is_gone_when_cancelled_during_a_call() -> None:
    pids: list[int] = []
    with anyio.fail_after(LIMIT):
        with anyio.CancelScope() as scope:
            async with echo().connect() as toolset:
                pids.append(await server_pid(toolset))
                scope.deadline = anyio.current_time() + 0.5  # the call takes 60s: cancelled
                await toolset.call("sleep", {"seconds": 60})
    assert scope.cancelled_caught
    assert gone(pids[0])


async def test_process_is_gone_when_cancelled_while_starting(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with anyio.fail_after(LIMIT):
        with anyio.move_on_after(2) as scope:  # it never initialises: cancelled while opening
            async with anyio.create_task_group() as tg:
                await echo("--silent", str(pidfile), init_timeout=LIMIT).open(tg)
    assert scope.cancelled_caught
    assert gone(int(pidfile.read_text()))  # written at its start, long before the deadline


async def test_process_is_gone_after_an_exception_in_the_using_scope() -> None:
    pids: list[int] = []
    with anyio.fail_after(LIMIT):
        with pytest.raises(KeyError, match="the loop failed"):  # as raised, not in a group
            async with echo().connect() as toolset:
                pids.append(await server_pid(toolset))
                raise KeyError("the loop failed")
        assert gone(pids[0])
        with pytest.raises(ExceptionGroup) as info:
            async with anyio.create_task_group() as tg:
                toolset = await echo().open(tg)
                pids.append(await server_pid(toolset))
                raise KeyError("the loop failed")
    assert info.group_contains(KeyError)
    assert gone(pids[1])


async def test_a_server_that_dies_gives_error_results_not_a_failed_task_group() -> None:
    with anyio.fail_after(LIMIT):
        async with echo().connect() as toolset:
            pid = await server_pid(toolset)
            with pytest.raises(ToolError, match="stopped during the call to 'crash'"):
                await toolset.call("crash", {})
            with pytest.raises(ToolError, match="'echo'"):
                await toolset.call("echo", {"text": "anyone?"})
    assert gone(pid)


# ---------------------------------------------------------------------- failing to start


async def test_a_missing_command_names_the_server_and_command_not_the_env(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = MCPServer("ghost", "/nonexistent/celldialog-mcp-server", ("--stdio",),
                       env={"TOKEN": SECRET})
    with anyio.fail_after(LIMIT), pytest.raises(MCPServerError) as info:
        async with server.connect():
            pytest.fail("a server that cannot start must not be entered")
    text = str(info.value)
    assert "MCP server 'ghost'" in text
    assert "/nonexistent/celldialog-mcp-server --stdio" in text and "not found" in text
    assert SECRET not in text and SECRET not in caplog.text


async def test_a_command_that_is_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    with anyio.fail_after(LIMIT), pytest.raises(MCPServerError, match="not executable"):
        async with MCPServer("sh", str(script)).connect():
            pass


async def test_a_server_crashing_on_init_is_reported_with_its_stderr() -> None:
    with anyio.fail_after(LIMIT), pytest.raises(MCPServerError) as info:
        async with echo("--crash-on-init").connect():
            pass
    text = str(info.value)
    assert "MCP server 'echo'" in text and "--crash-on-init" in text
    assert "failed during the MCP initialisation" in text
    assert "the database is missing" in text  # the server's own words, from its stderr


async def test_stderr_quoted_in_an_error_has_env_values_redacted() -> None:
    server = echo("--leak-env-on-init", "ECHO_SECRET", env={"ECHO_SECRET": SECRET})
    with anyio.fail_after(LIMIT), pytest.raises(MCPServerError) as info:
        async with server.connect():
            pass
    text = str(info.value)
    assert "token is ***" in text
    assert SECRET not in text


async def test_a_server_that_never_initialises_times_out() -> None:
    with anyio.fail_after(LIMIT), pytest.raises(MCPServerError) as info:
        async with echo("--silent", init_timeout=0.5).connect():
            pass
    assert "did not complete the MCP initialisation within 0.5s" in str(info.value)
    assert "raise init_timeout" in str(info.value)


# ---------------------------------------------------------------------- units


def test_invalid_tool_names_are_sanitised_and_never_clash_with_valid_ones() -> None:
    from mcp.types import Tool as MCPTool

    from runtime.conversation.mcp import _listing

    def tool(name: str) -> MCPTool:
        return MCPTool(name=name, input_schema={"type": "object"})

    listing = _listing([tool("files.read"), tool("files_read"), tool("files/read"),
                        tool("x" * 70), tool("ok-name")])
    assert {listed: original for listed, (_, original) in listing.items()} == {
        "files_read": "files_read",  # a valid name keeps itself, even when listed later
        "files_read_2": "files.read",
        "files_read_3": "files/read",
        "x" * 64: "x" * 70,
        "ok-name": "ok-name",
    }


def test_importing_the_module_does_not_import_the_sdk() -> None:
    import subprocess

    code = ("import sys, runtime.llm, runtime.conversation.toolset; before = 'mcp' in sys.modules; "
            "import runtime.conversation.mcp; print(before, 'mcp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.split() == ["False", "False"]  # the SDK costs a second to import
