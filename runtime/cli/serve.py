"""``celldialog serve [PATTERN]``: the pattern as a page in the browser, for many users.

One process, one runtime, one instance per user and session; the page and its wire format
are ``runtime.web``'s (``docs/web.md``). The model and the store are resolved before the
server starts, as ``chat`` does, so a bad name, a missing key or an unreachable server is
one line and an exit status, not a page that fails later. It binds 127.0.0.1 unless told
otherwise, and prints the URL it serves (the real port when ``--port 0`` asks for any).
"""

from __future__ import annotations

import socket
from typing import Any

import click

from .common import model_option, pattern_args, store_option, store_url
from .errors import CliError, UsageProblem

__all__ = ["command"]


@click.command(name="serve")
@click.argument("pattern", required=False)
@model_option
@store_option("celldialog.db in the user data directory, shared with chat")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on (0.0.0.0: every interface).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="The port (0: any free one; the URL printed says which).")
@click.option("--args", "args_json", default=None, metavar="JSON",
              help="The pattern's arguments, a JSON object (the same for every session).")
@click.option("--space", default="default", show_default=True, metavar="NAME",
              help="The space: documents of different spaces never meet.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A Host name the server answers to (repeatable; default: the loopback "
              "names when bound to loopback, else any).")
@click.option("--allowed-origin", "allowed_origins", multiple=True, metavar="URL",
              help="Another origin that may POST, as https://chat.example.com (a proxy "
              "serving the page under another name).")
@click.option("--auth", "auth", default=None, metavar="MODULE:FUNCTION",
              help="Your authentication: a function of the request returning the user id "
              "(or None: 401), instead of the server's own cookie.")
@click.option("--max-connections", default=None, type=click.IntRange(1), metavar="N",
              help="Event streams one user may keep open (default 16).")
@click.option("--coalesce", default=None, type=click.FloatRange(0, 10), metavar="SECONDS",
              help="Gather commits over this long into one patch (default 0.03).")
@click.option("--limit", "limit_args", multiple=True, metavar="NAME=VALUE",
              help="Any other of the server's limits (docs/web.md), as "
              "--limit events_per_second=10 (repeatable).")
def command(pattern: str | None, model: str | None, store: str | None, host: str, port: int,
            args_json: str | None, space: str, allowed_hosts: tuple[str, ...],
            allowed_origins: tuple[str, ...], auth: str | None,
            max_connections: int | None, coalesce: float | None,
            limit_args: tuple[str, ...]) -> None:
    """Serve PATTERN (default: the bundled chatbot) as a web page, one conversation per
    session; each browser gets its own user."""
    try:
        import uvicorn

        from ..web import Limits, create_app
    except ImportError as e:
        raise CliError(f"serve needs the web extra ({e.name} is missing): "
                       "pip install 'celldialog[web]'") from None
    args = pattern_args(args_json)
    url = store_url(store, "")

    from .common import choose_model, default_store
    from .loading import DEFAULT_CHAT_PATTERN, load_pattern

    target = load_pattern(pattern or DEFAULT_CHAT_PATTERN)
    _log_server_faults()
    choice = choose_model(model)
    limits = _limits(Limits, limit_args, max_connections=max_connections, coalesce=coalesce)
    from ..llm import is_loopback_host
    from ..web.guards import LOOPBACK_HOSTS

    loopback = is_loopback_host(host)
    # bound to loopback, the URL printed keeps working beside the names given
    hosts = ([*allowed_hosts, *(LOOPBACK_HOSTS if loopback else ())] if allowed_hosts
             else None if loopback else ["*"])
    where = url or default_store()
    from ..llm.config import Settings
    from ..web import SECRET_VAR

    secret = Settings().get(SECRET_VAR)  # the environment, then .env, as keys are read
    app = create_app(target, store=where, model=choice.model, args=args, space=space,
                     secret=secret,
                     authenticate=_load_auth(auth) if auth else None, limits=limits,
                     allowed_hosts=hosts, allowed_origins=list(allowed_origins),
                     freeze_gc=True)  # the process is the server's: see runtime.cells.collector
    sock = _bind(host, port)

    import anyio

    async def main() -> None:
        from .common import close_model, reachable

        try:
            await reachable(choice.model)
            shown = f"[{host}]" if ":" in host else host
            bound = sock.getsockname()[1]
            click.echo(f"celldialog serve · {target.key}")
            click.echo(f"model: {choice.label} ({choice.why})")
            click.echo(f"store: {where.removeprefix('sqlite:///')}")
            if hosts == ["*"]:
                click.echo("answering to any Host name: name yours with --allowed-host "
                           "(a page elsewhere can reach a server by pointing a name at it)")
            click.echo(f"serving on http://{shown}:{bound}/ (Ctrl-C stops)", nl=True)
            config = uvicorn.Config(app, log_level="warning", access_log=False,
                                    lifespan="on", timeout_graceful_shutdown=3)
            await uvicorn.Server(config).serve(sockets=[sock])
        finally:
            await close_model(choice.model)
            sock.close()

    anyio.run(main)


def _log_server_faults() -> None:
    """The server's own faults (a handler that crashed, a failed patch) reach stderr, one
    block each, even without ``--verbose`` (which logs everything the runtime does)."""
    import logging
    import sys

    parent = logging.getLogger("celldialog")
    if any(not isinstance(h, logging.NullHandler) for h in parent.handlers):
        return  # --verbose: the parent logger already prints them
    web = logging.getLogger("celldialog.web")
    if any(getattr(h, "celldialog_serve", False) for h in web.handlers):
        return  # already added (the command ran before in this process)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.celldialog_serve = True  # type: ignore[attr-defined]
    web.addHandler(handler)
    web.setLevel(logging.WARNING)


def _limits(limits_class: Any, pairs: tuple[str, ...], **given: Any) -> Any:
    """``Limits`` from ``--limit NAME=VALUE`` pairs and the options that name one."""
    import dataclasses

    from ..web import WebConfigError

    fields = {f.name: f.type for f in dataclasses.fields(limits_class)}
    values = {k: v for k, v in given.items() if v is not None}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise UsageProblem(f"--limit takes NAME=VALUE with NAME one of "
                               f"{', '.join(fields)}; got {pair!r}")
        try:
            values[name] = int(text) if fields[name] in (int, "int") else float(text)
        except ValueError:
            raise UsageProblem(f"--limit {name}: {text!r} is not a number") from None
    try:
        return limits_class(**values)
    except WebConfigError as e:
        raise UsageProblem(f"--limit: {e}") from None


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that a port in use is one clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UsageProblem(f"cannot listen on {host}:{port} ({e.strerror}): choose another "
                           "--port (0 picks a free one) or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _load_auth(spec: str) -> Any:
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise UsageProblem(f"--auth takes MODULE:FUNCTION, got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UsageProblem(f"--auth {spec}: cannot load it ({e})") from None
    if not callable(fn):
        raise UsageProblem(f"--auth {spec} is not a function")
    return fn
