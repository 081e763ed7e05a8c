"""The web page's errors (their place in the tree: ``runtime/errors.py``).

A request a client got wrong is not an exception of ours: it is answered with its status and
a JSON ``{"error": ...}`` naming the fix (``runtime/web/app.py``). These are for the code
that builds and configures the server.
"""

from __future__ import annotations

from ..errors import CelldialogError

__all__ = ["WebConfigError", "WebError"]


class WebError(CelldialogError):
    """The web server (runtime.web) cannot do what it was asked."""


class WebConfigError(WebError, ValueError):
    """A setting of the server that cannot be used: a short secret, bad limits, an auth hook
    that returned something that is not a user id, something that is not a pattern."""
