"""What several commands share: the store, the model, JSON arguments, a result as JSON."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..llm.deferred import DeferredModel as _Deferred
from .errors import CliError, UsageProblem

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ..cells import Instance
    from ..llm import Model
    from ..llm.events import StreamEvent
    from ..llm.types import Request, Response

__all__ = [
    "DEFAULT_SESSION",
    "DEFAULT_STORE_FILE",
    "DeferredModel",
    "ModelChoice",
    "choose_model",
    "default_store",
    "default_user",
    "model_option",
    "parse_json",
    "pattern_args",
    "result_state",
    "scope_options",
    "store_option",
    "store_url",
]

DEFAULT_STORE_FILE = "celldialog.db"

F = TypeVar("F", bound=Callable[..., Any])


def default_store() -> str:
    """SQLite in the user's data directory (platformdirs): where chats persist by default."""
    import platformdirs

    folder = platformdirs.user_data_path("celldialog", appauthor=False)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(
            f"cannot create the data directory {str(folder)!r} ({e.strerror}): pass "
            "--store sqlite:///path/to/file.db or --store memory") from None
    return f"sqlite:///{folder / DEFAULT_STORE_FILE}"


def store_url(value: str | None, default: str) -> str:
    """``--store``: ``memory``, ``sqlite:///path``, a bare path to a SQLite file, or a
    ``postgresql://`` URL (several processes, or machines, on one database)."""
    if value is None:
        return default
    value = value.strip()
    if value == "memory" or value.startswith(("sqlite:///", "postgresql://", "postgres://")):
        return value
    if "://" in value or not value:
        from ..storage import redact

        raise UsageProblem(
            f"unknown store {redact(value)!r}: use 'memory', 'sqlite:///path/to/file.db', "
            f"a path, or 'postgresql://user@host/dbname'")
    return f"sqlite:///{Path(value).expanduser()}"


def default_user() -> str:
    """The login name: a person's chats are theirs by default."""
    try:
        return getpass.getuser() or "local"
    except Exception:  # no login name (a container without one): still a valid id
        return "local"


DEFAULT_SESSION = "default"


def _or_default(default: Callable[[], str]) -> Callable[[click.Context, click.Parameter, Any], str]:
    def fill(ctx: click.Context, param: click.Parameter, value: Any) -> str:
        return default() if value is None else value
    return fill


def model_option(fn: F) -> F:
    """``--model``, as the commands that talk to a model take it."""
    return click.option("--model", default=None, metavar="NAME",
                        help="The model (default: CELLDIALOG_MODEL, else the resolver's "
                        "default).")(fn)


def store_option(default: str) -> Callable[[F], F]:
    """``--store``, with what it defaults to (``default`` completes the help)."""
    return click.option("--store", default=None, metavar="URL",
                        help=f"sqlite:///path.db, a path, postgresql://user@host/db, or memory "
                        f"(default: {default}).")


def scope_options(fn: F) -> F:
    """``--space``, ``--user``, ``--session``: whose documents a run sees. One default for
    every command: the space ``default``, the user your login name, the session ``default``
    (so ``chat``, ``run`` and ``mcp`` on one store see the same per-user documents)."""
    fn = click.option("--session", default=None, callback=_or_default(lambda: DEFAULT_SESSION),
                      metavar="ID", help="Session id (per-session cells: a conversation; "
                      f"default: {DEFAULT_SESSION}).")(fn)
    fn = click.option("--user", default=None, callback=_or_default(default_user), metavar="ID",
                      help="User id (per-user cells; default: your login name).")(fn)
    fn = click.option("--space", default="default", show_default=True, metavar="NAME",
                      help="The space: documents of different spaces never meet.")(fn)
    return fn


def parse_json(text: str, what: str) -> Any:
    """``text`` as JSON, or a ``UsageProblem`` naming the argument and the position."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageProblem(
            f"{what} is not valid JSON ({e.msg} at column {e.colno}): {text[:60]!r}; "
            "strings need quotes, as in '\"hello\"'") from None


def pattern_args(text: str | None) -> dict[str, Any] | None:
    """``--args``: a JSON object of the pattern's arguments (None when not given)."""
    if text is None:
        return None
    args = parse_json(text, "--args")
    if not isinstance(args, dict):
        raise UsageProblem(f"--args must be a JSON object, got {type(args).__name__}")
    return args


def result_state(inst: Instance) -> Any:
    """The instance's result as plain JSON: its cells' values, its streams left out (they
    are inputs, not state)."""
    value = inst.result.get()
    for dotted in inst.streams:
        _drop(value, dotted.split("."))
    return value


def _drop(value: Any, path: list[str]) -> None:
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        if not rest:
            value.pop(head, None)
        elif head in value:
            _drop(value[head], rest)
    elif isinstance(value, list) and head.isdigit() and int(head) < len(value):
        if rest:
            _drop(value[int(head)], rest)


def start(rt: Any, pattern: Any, args: dict[str, Any] | None, space: str,
          user: str | None, session: str | None) -> Instance:
    """``rt.run`` with its scope errors said in the command's terms (``--user``...)."""
    from ..errors import NotJSONError, PatternError, SchemaError, ScopeError
    from .errors import PatternNotUsable

    try:
        return rt.run(pattern, args, space=space, user=user, session=session)
    except ScopeError as e:
        raise UsageProblem(f"--user/--session: {e}") from None
    except (SchemaError, NotJSONError) as e:
        raise UsageProblem(f"--args: {e}") from None
    except PatternError as e:
        text = str(e)
        flag = next((f for f in ("session", "user") if f"{f}=...)" in text), None)
        if flag is not None:
            raise UsageProblem(f"pattern {pattern.name} has {flag}-scoped cells: pass "
                               f"--{flag} ID") from None
        if " arguments " in text:  # unknown or missing arguments
            raise UsageProblem(f"--args: {text}") from None
        raise PatternNotUsable(f"pattern {pattern.name} cannot start: {text}") from None


# -- the model ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelChoice:
    """The model a command uses and why that one (for the user to see)."""

    model: Model
    why: str

    @property
    def label(self) -> str:
        return f"{self.model.provider}:{self.model.name}"


def why_default(explicit: str | None, model: Model | None = None) -> str:
    """Why ``resolve_model(explicit)`` picks what it picks (``model``, when it did), in the
    resolver's precedence: the argument, then ``CELLDIALOG_MODEL`` (environment, then
    ``.env``), then the default."""
    from ..llm.config import DEFAULT_MODEL_VAR, PROVIDER_VARS, Settings

    if explicit and explicit.strip():
        return "--model"
    if os.environ.get(DEFAULT_MODEL_VAR):
        return f"{DEFAULT_MODEL_VAR} in the environment"
    settings = Settings()
    if settings.get(DEFAULT_MODEL_VAR):
        return f"{DEFAULT_MODEL_VAR} in .env"
    if model is not None and model.provider == "local":
        return (f"the default: no --model and {DEFAULT_MODEL_VAR} unset, so the embedded "
                "local model, offline")
    keys = [v.api_key for v in PROVIDER_VARS.values() if settings.get(v.api_key)]
    have = f"{', '.join(keys)} set" if keys else "no provider key set"
    return f"the default: no --model, {DEFAULT_MODEL_VAR} unset, {have}"


def choose_model(name: str | None) -> ModelChoice:
    """Resolve ``--model`` (or the default) now, so a bad name or a missing key is one
    line before anything starts. Raises the port's ``ConfigurationError``."""
    from ..llm import resolve_model

    model = resolve_model(name or None)
    return ModelChoice(model, why_default(name, model))


async def reachable(model: Model, timeout: float = 5.0) -> None:
    """Raise a ``CliError`` (exit 5) if the model's server does not accept a connection.

    Only a TCP connection, no request: it costs no tokens and tells "nothing listens there"
    apart from what the first turn would say. In-process models have no URL to check."""
    import anyio

    from ..llm.config import provider_vars
    from ..llm.safety import display_url

    url = getattr(model, "_base_url", None)  # the HTTP adapters' base URL
    if not isinstance(url, str):
        return
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if _proxied(parts.scheme, host):
        return  # httpx will go through the proxy: a direct connection proves nothing
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_tcp(host, port)
        await stream.aclose()
    except (OSError, TimeoutError) as e:
        why = "timed out" if isinstance(e, TimeoutError) else (
            getattr(e, "strerror", None) or str(e) or type(e).__name__)
        from ..llm.safety import is_loopback_host

        try:
            var = provider_vars(model.provider)
        except KeyError:  # a provider that reads no variables (the local model)
            var = None
        fix = "start the server" if is_loopback_host(host) else "check the network"
        if var:
            fix += f", or point {var.base_url} elsewhere"
        from .errors import EXIT_MODEL

        raise CliError(
            f"cannot reach model {model.provider}:{model.name} at {display_url(url)} ({why}): "
            f"{fix}, or choose another with --model", EXIT_MODEL) from None


def _proxied(scheme: str, host: str) -> bool:
    """Whether an HTTP proxy from the environment (as httpx reads it) carries ``host``."""
    from urllib.request import getproxies, proxy_bypass

    proxies = getproxies()
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    try:
        return not proxy_bypass(host)
    except OSError:
        return True


async def close_model(model: Any) -> None:
    """Release the adapter's HTTP client (adapters own one when given none)."""
    aclose = getattr(model, "aclose", None)
    if callable(aclose):
        await aclose()


class DeferredModel(_Deferred):
    """A ``Model`` resolved at its first call: ``run`` and ``mcp`` pass one to the runtime
    so a pattern without a dialog never needs a key, and one with a dialog gets the same
    model ``chat`` would (``--model``, else the default). Before its first call it checks
    the server accepts a connection, as ``chat`` does before its first line.

    A failure (the name does not resolve, the server is unreachable, a call failed) is the
    turn's error, as any model failure is, and is also kept in ``failure``: the last call's,
    None again once a call succeeds. So a command can end with the status of that failure
    (``errors.exit_status``: 4 configuration, 5 unreachable or refused), the rule ``chat``
    follows before it starts."""

    def __init__(self, name: str | None) -> None:
        self._name = name or None
        self._checked = False
        self.failure: BaseException | None = None

    def _build(self) -> Model:
        from ..llm import resolve_model

        try:
            return resolve_model(self._name)
        except Exception as e:
            self.failure = e
            raise

    async def _ready(self) -> Model:
        model = self._get()
        if not self._checked:
            try:
                await reachable(model)
            except CliError as e:
                self.failure = e
                raise
            self._checked = True
        return model

    async def generate(self, request: Request) -> Response:
        from ..errors import CelldialogError

        try:
            response = await (await self._ready()).generate(request)
        except CelldialogError as e:
            self.failure = e
            raise
        self.failure = None
        return response

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        from ..errors import CelldialogError

        model = await self._ready()
        try:
            async for event in model.stream(request):
                yield event
        except CelldialogError as e:
            self.failure = e
            raise
        self.failure = None
