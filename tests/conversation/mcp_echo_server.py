"""A small stdio MCP server for the tests, written with the official SDK (FastMCP, which mcp 2
calls ``mcp.server.mcpserver.MCPServer``). Run it as ``sys.executable mcp_echo_server.py``.

Tools: ``echo``, ``add``, ``fail`` (an error result), ``pid`` (the server's process id, so a
test can check the process is gone), ``env`` (reads a variable of the server's environment),
``image`` (non-text content), ``big`` (a long text), ``sleep``, ``crash`` (the process dies
mid-call) and ``files.read`` (a name no model provider accepts as is), ``grow`` (adds a tool).

One optional argument picks a misbehaviour at start-up: ``--crash-on-init`` (writes to stderr,
exits 3 before speaking MCP), ``--silent [PIDFILE]`` (writes its pid to PIDFILE, reads stdin
and never answers; exits on EOF), ``--leak-env-on-init NAME`` (prints the variable NAME to
stderr, then crashes, so tests can check a secret is redacted from the error).
"""

import os
import sys


def serve() -> None:
    """Build the server and run it on stdio (the SDK is imported here: the misbehaving modes
    start in milliseconds without it)."""
    import anyio
    from mcp.server.mcpserver import Image
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError

    server = FastMCP("echo")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def fail(message: str) -> str:
        """Always fail, with the given message."""
        raise ToolError(message)

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def env(name: str) -> str:
        """The value of an environment variable of the server, or '<unset>'."""
        return os.environ.get(name, "<unset>")

    @server.tool()
    def image() -> Image:
        """A tiny PNG."""
        return Image(data=b"\x89PNG\r\n\x1a\n" + b"\0" * 8, format="png")

    @server.tool()
    def big(chars: int) -> str:
        """A text of that many characters."""
        return "x" * chars

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Wait that long, then answer (a call the tests cancel)."""
        await anyio.sleep(seconds)
        return "slept"

    @server.tool()
    def crash() -> str:
        """Kill the server process mid-call."""
        os._exit(7)

    @server.tool()
    def grow(name: str) -> str:
        """Add a tool of that name (it echoes its text): the tools change while running."""
        def grown(text: str) -> str:
            return text

        server.add_tool(grown, name=name, description="A tool added while running.")
        return f"added {name}"

    @server.tool(name="files.read")
    def files_read(path: str) -> str:
        """Pretend to read a file."""
        return f"contents of {path}"

    server.run()


def main(argv: list[str]) -> None:
    if argv[:1] == ["--crash-on-init"]:
        print("echo server: cannot start, the database is missing", file=sys.stderr)
        sys.exit(3)
    if argv[:1] == ["--leak-env-on-init"]:
        print(f"echo server: token is {os.environ.get(argv[1], '')}", file=sys.stderr)
        sys.exit(4)
    if argv[:1] == ["--silent"]:
        if len(argv) > 1:
            with open(argv[1], "w") as f:
                f.write(str(os.getpid()))
        sys.stdin.read()
        return
    serve()


if __name__ == "__main__":
    main(sys.argv[1:])
