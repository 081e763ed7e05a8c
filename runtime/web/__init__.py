"""The web page of a pattern: ``celldialog serve``, or ``create_app`` in an application.

Its own package above the runtime (nothing below imports it), in the ``web`` extra:
Starlette, sse-starlette and uvicorn. See ``docs/web.md``.
"""

from __future__ import annotations

from .app import create_app
from .errors import WebConfigError, WebError
from .identity import COOKIE, SECRET_VAR, Authenticate
from .limits import Limits

__all__ = ["COOKIE", "SECRET_VAR", "Authenticate", "Limits", "WebConfigError", "WebError",
           "create_app"]
