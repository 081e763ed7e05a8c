"""Who is asking: users named by the server, never by the client.

By default a user is a random id the server mints on the first visit to the page and keeps
in a signed cookie (HMAC-SHA256 over the id with a secret only the server knows). A request
whose cookie is missing, altered or signed with another secret has no user; only the page's
own GET mints one, so an API call without the cookie is refused, never given a fresh user.

The cookie is ``HttpOnly`` (no script reads it) and ``SameSite=Strict`` (no other site's page
can make the browser send it). Over HTTPS it is ``__Host-celldialog_user``: ``Secure``, and
a name browsers accept only without a ``Domain``, so a sibling subdomain cannot plant its
own. A request carrying the cookie twice (one planted beside the real one) has no user.

An application with its own login plugs it in with ``authenticate``: a function of the
request that returns the user's id, or None to refuse (401). Then no cookie is minted.

The secret comes from configuration (``CELLDIALOG_WEB_SECRET``, or the ``secret`` argument),
else it is generated once and kept, readable by its owner only, in the user data directory,
so the cookies of a server survive its restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import unicodedata
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import WebConfigError

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = [
    "COOKIE",
    "SECRET_VAR",
    "Authenticate",
    "CookieSigner",
    "check_user_id",
    "cookie_name",
    "load_secret",
    "new_id",
    "read_cookie",
]

COOKIE = "celldialog_user"
SECRET_VAR = "CELLDIALOG_WEB_SECRET"
SECRET_FILE = "web-secret"
MIN_SECRET_BYTES = 32
MAX_USER_ID = 256

Authenticate = Callable[["Request"], "Awaitable[str | None] | str | None"]
"""The auth hook: the request's user id, or None when the request has none (401)."""

_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")


def cookie_name(scheme: str) -> str:
    """The cookie's name: ``__Host-`` prefixed over HTTPS."""
    return f"__Host-{COOKIE}" if scheme == "https" else COOKIE


def read_cookie(header: str, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header; None if absent or present more
    than once (which one the browser meant cannot be known)."""
    values = [v for k, _, v in (part.strip().partition("=") for part in header.split(";"))
              if k == name]
    return values[0] if len(values) == 1 else None


def new_id() -> str:
    """A fresh id for a user or a session: 128 random bits, URL-safe."""
    return secrets.token_urlsafe(16)


def is_minted_id(text: str) -> bool:
    """Whether ``text`` has the shape of an id ``new_id`` makes (checked before lookups)."""
    return _ID.fullmatch(text) is not None


def check_user_id(user: object) -> str:
    """A user id from the auth hook, checked: a non-empty string of at most 256 characters,
    none of them a control, format (bidi overrides), separator-line or unassigned
    character, nor half a surrogate pair."""
    if not isinstance(user, str) or not user or len(user) > MAX_USER_ID:
        raise WebConfigError(
            f"the authenticate hook must return a user id (a non-empty string of at most "
            f"{MAX_USER_ID} characters) or None, got {type(user).__name__}"
            + (f" of {len(user)} characters" if isinstance(user, str) else ""))
    if any(unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp")
           for c in user):
        raise WebConfigError("the authenticate hook returned a user id with control, format "
                             "or unassigned characters: return a printable id")
    return user


class CookieSigner:
    """Signs a user id into the cookie's value and reads it back (None when forged)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise WebConfigError(
                f"the web secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}: "
                f"set {SECRET_VAR} to a long random string (python -c \"import secrets; "
                "print(secrets.token_urlsafe(48))\")")
        self._key = hashlib.sha256(b"celldialog web cookie\0" + secret).digest()

    def _mac(self, user: str) -> str:
        digest = hmac.new(self._key, user.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def sign(self, user: str) -> str:
        return f"{user}.{self._mac(user)}"

    def unsign(self, value: str | None) -> str | None:
        if not value or len(value) > 200:
            return None
        user, dot, mac = value.rpartition(".")
        if not dot or not is_minted_id(user):
            return None
        return user if hmac.compare_digest(mac, self._mac(user)) else None

    def __repr__(self) -> str:
        return "CookieSigner(<secret>)"  # never the key


def load_secret(secret: str | bytes | None = None, folder: Path | None = None) -> bytes:
    """The signing secret: ``secret`` if given, else ``CELLDIALOG_WEB_SECRET``, else the one
    kept in ``folder`` (the user data directory by default), made there on first use."""
    if secret is None:
        secret = os.environ.get(SECRET_VAR) or None
    if secret is not None:
        return secret.encode() if isinstance(secret, str) else bytes(secret)
    if folder is None:
        import platformdirs

        folder = platformdirs.user_data_path("celldialog", appauthor=False)
    path = folder / SECRET_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # made once, whole and private, by whoever links it first
            tmp = folder / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_urlsafe(48))
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
            finally:
                tmp.unlink()
        value = path.read_text().strip()
    except OSError as e:
        raise WebConfigError(
            f"cannot keep the web secret in {str(path)!r} ({e.strerror}): set {SECRET_VAR}"
        ) from None
    if len(value) < MIN_SECRET_BYTES:
        raise WebConfigError(
            f"the web secret in {str(path)!r} is too short: delete the file (a new one is "
            f"made) or set {SECRET_VAR}")
    return value.encode()
