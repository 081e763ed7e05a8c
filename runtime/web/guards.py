"""The checks in front of the app, each one layer of the middleware stack.

``HostGuard``: the ``Host`` a request names must be one the server answers to (by default
the loopback names), so a page on another site whose name an attacker points at 127.0.0.1
(DNS rebinding) is refused (400) before anything runs. IPv6 literals (``[::1]:8000``) are
parsed as such.

``OriginGuard``: a request that can change something (anything but GET, HEAD, OPTIONS) must
carry an ``Origin`` that is the page's own (the scheme and ``Host`` it was asked under) or
one the application allowed. Browsers send ``Origin`` on every such request, so another
site's page (a forged form, a script) and a replay from a tool that does not say where it
comes from are refused (403) before the app sees them. With the ``SameSite=Strict``
cookie, that is two independent locks on cross-site requests.

``SecurityHeaders``: every response says what the browser may do with it: only this site's
scripts, styles and connections (``Content-Security-Policy``, no inline script, so markup a
model wrote cannot run even if it reached the page's HTML), no framing, no MIME sniffing,
no referrer.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CSP", "LOOPBACK_HOSTS", "HostGuard", "OriginGuard", "SecurityHeaders", "host_name"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The names a server bound to loopback answers to by default."""

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
       "object-src 'none'")

_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

Scope = dict[str, Any]


class SecurityHeaders:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(h for h in _HEADERS if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, with_headers)


def host_name(host: str) -> str:
    """The name in a ``Host`` header, its port and an IPv6 literal's brackets removed,
    lower-cased: ``[::1]:8000`` -> ``::1``, ``Example.com:80`` -> ``example.com``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") > 1:  # a bare IPv6 address (as in a list of names), no port
        return host
    return host.partition(":")[0]


async def _refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class HostGuard:
    def __init__(self, app: Any, allowed: list[str] | tuple[str, ...]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = frozenset(host_name(h) for h in allowed)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self.any or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        name = host_name(hosts[0].decode("latin-1")) if len(hosts) == 1 else ""
        if name in self.allowed:
            await self.app(scope, receive, send)
            return
        await _refuse(send, 400, "this server does not answer to that Host name: add it "
                                 "with --allowed-host (allowed_hosts=)")


class OriginGuard:
    def __init__(self, app: Any, allowed: list[str]) -> None:
        self.app = app
        self.allowed = frozenset(o.rstrip("/").lower() for o in allowed)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in _SAFE:
            await self.app(scope, receive, send)
            return
        origins = [v for k, v in scope["headers"] if k == b"origin"]
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        origin = origins[0].decode("latin-1").strip().lower() if len(origins) == 1 else ""
        host = hosts[0].decode("latin-1").strip().lower() if hosts else ""
        own = f"{scope.get('scheme', 'http')}://{host}"
        if origin and (origin == own or origin in self.allowed):
            await self.app(scope, receive, send)
            return
        why = ("without an Origin header (browsers send one; another client must too)"
               if not origins else "with several Origin headers" if len(origins) > 1
               else "from another origin")
        await _refuse(send, 403, f"refused: a {scope['method']} {why}; this server takes "
                                 f"them from {own} only")
