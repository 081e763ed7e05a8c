"""The checks in front of the app, each one layer of the middleware stack.

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

__all__ = ["CSP", "OriginGuard", "SecurityHeaders"]

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


class OriginGuard:
    def __init__(self, app: Any, allowed: list[str]) -> None:
        self.app = app
        self.allowed = frozenset(o.rstrip("/").lower() for o in allowed)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in _SAFE:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1").strip().lower()
        host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        own = f"{scope.get('scheme', 'http')}://{host}"
        if origin and (origin == own or origin in self.allowed):
            await self.app(scope, receive, send)
            return
        why = ("without an Origin header (browsers send one; another client must too)"
               if not origin else "from another origin")
        body = json.dumps({"error": f"refused: a {scope['method']} {why}; this server takes "
                                    f"them from {own} only"}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
