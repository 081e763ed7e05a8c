"""PostgreSQL store URLs: our options taken out of a libpq URL, and its passwords kept out of
every message.

A store URL is libpq's, so anything libpq takes (``sslmode``, ``host=/socket/dir``,
``options=-c ...``) passes through untouched, byte for byte: only our own parameters are
cut out of the query, and nothing else is decoded and encoded again (``+`` and spaces mean
what libpq says they mean). Passwords can sit in the authority (``user:pw@``), in any query
parameter whose name ends in ``password``, and inside ``listen_url``; ``redact`` hides them
all, and ``scrub`` removes them from text a driver wrote (libpq quotes a malformed URL back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote, urlsplit

from ..errors import StoreConfigError

__all__ = ["DEFAULT_BUSY_TIMEOUT", "DEFAULT_POOL_SIZE", "PgOptions", "check_busy_timeout",
           "check_listen_url", "check_pool_size", "parse_url", "redact", "scrub",
           "secrets_of"]

DEFAULT_POOL_SIZE = 4
DEFAULT_BUSY_TIMEOUT = 5.0
CONNECT_TIMEOUT = "10"  # seconds, unless the URL says otherwise: a dead host fails, not hangs
_OURS = ("pool_size", "prepare", "busy_timeout", "listen_url")
_KEEPALIVE = (("keepalives", "1"), ("keepalives_idle", "30"), ("keepalives_interval", "10"),
              ("keepalives_count", "3"))
_PREPARE = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


@dataclass(frozen=True)
class PgOptions:
    """Our options of a store URL, checked (``parse_url``)."""

    pool_size: int = DEFAULT_POOL_SIZE
    prepare: bool = True
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    listen_url: str | None = None  # the feed's own libpq URL, options taken out


def check_pool_size(value: object, where: str) -> int:
    """Refuse (``StoreConfigError``) a pool size that is not an integer from 1 to 100."""
    if type(value) is int and 1 <= value <= 100:
        return value
    raise StoreConfigError(f"pool_size {where} is the number of pooled connections, an "
                           f"integer from 1 to 100; got {value!r}")


def check_busy_timeout(value: object, where: str, given: object = None) -> float:
    """Refuse a busy timeout that is not seconds from 0 to 3600 (``given``: as written)."""
    if (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 <= value <= 3600 and math.isfinite(value)):
        return float(value)
    raise StoreConfigError(f"busy_timeout {where} is the seconds a commit waits for a row "
                           f"another transaction has locked, a number >= 0 and <= 3600; got "
                           f"{value if given is None else given!r}")


def parse_url(url: str) -> tuple[str, PgOptions]:
    """The libpq URL with our options cut out (and TCP keepalives and a connect timeout
    added where it sets none), and our options, checked."""
    shown = redact(url)
    where = f"in store {shown!r}"
    base, query, fragment = _split(url)
    keep: list[str] = []
    ours: dict[str, object] = {}
    for part in query.split("&") if query else []:
        name, _, value = part.partition("=")
        if unquote(name) in _OURS:
            ours[unquote(name)] = unquote(value)
        else:
            keep.append(part)
    options = PgOptions()
    if "pool_size" in ours:
        text = str(ours["pool_size"])
        options = replace(options, pool_size=check_pool_size(
            int(text) if text.isascii() and text.isdigit() else text, where))
    if "prepare" in ours:
        text = str(ours["prepare"]).lower()
        if text not in _PREPARE:
            raise StoreConfigError(f"prepare {where} is on or off (off for PgBouncer in "
                                   f"transaction mode); got {ours['prepare']!r}")
        options = replace(options, prepare=_PREPARE[text])
    if "busy_timeout" in ours:
        text = str(ours["busy_timeout"])
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        options = replace(options, busy_timeout=check_busy_timeout(seconds, where, text))
    if "listen_url" in ours:
        options = replace(options, listen_url=check_listen_url(str(ours["listen_url"]),
                                                                where))
    names = {unquote(p.partition("=")[0]) for p in keep}
    host = next((unquote(p.partition("=")[2]) for p in keep
                 if unquote(p.partition("=")[0]) == "host"), None)
    if host is None:
        try:
            host = urlsplit(base).hostname or ""
        except ValueError:
            host = ""
    added = [] if "connect_timeout" in names else [("connect_timeout", CONNECT_TIMEOUT)]
    if not host.startswith("/"):  # TCP: keepalives find a dead peer during a long idle
        added += [(n, v) for n, v in _KEEPALIVE if n not in names]
    keep += [f"{n}={v}" for n, v in added]
    return base + ("?" + "&".join(keep) if keep else "") + fragment, options


def check_listen_url(text: str, where: str) -> str:
    """The feed's own libpq URL, options cut out; refused if it is not a PostgreSQL URL."""
    if not text.startswith(("postgresql://", "postgres://")):
        raise StoreConfigError(f"listen_url {where} is a libpq URL (percent-encoded), "
                               f"'postgresql://...'; got {redact(text)!r}")
    return parse_url(text)[0]


def _split(url: str) -> tuple[str, str, str]:
    base, _, rest = url.partition("?")
    query, hash_, fragment = rest.partition("#")
    return base, query, hash_ + fragment


def _userinfo(url: str) -> tuple[int, int] | None:
    """Where the userinfo is: between ``://`` and the last ``@``. (A password may hold an
    unencoded ``/``, ``?`` or ``#``: only the last ``@`` is sure to end it. An ``@`` in
    the query makes this span too much, which hides more than needed, never less.)"""
    i, j = url.find("://"), url.rfind("@")
    return (i + 3, j) if 0 <= i < j else None


def redact(url: str) -> str:
    """``url`` with every password shown as ``***``: the authority's, any query parameter
    named ``...password``, those inside ``listen_url``. A URL with nothing secret in it is
    returned as given."""
    if not isinstance(url, str):
        return "<not a URL>"
    span = _userinfo(url)
    if span is not None and ":" in url[span[0]:span[1]]:
        user = url[span[0]:span[1]].split(":", 1)[0]
        url = url[:span[0]] + user + ":***" + url[span[1]:]
    base, query, fragment = _split(url)
    if not query:
        return url
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        key = unquote(name).lower()
        if key.endswith("password") and eq:
            part = f"{name}=***"
        elif key == "listen_url" and eq:
            part = f"{name}={quote(redact(unquote(value)), safe=':/@*')}"
        parts.append(part)
    return base + "?" + "&".join(parts) + fragment


def secrets_of(url: str) -> list[str]:
    """The password texts in ``url`` (raw and decoded), longest first, for ``scrub``."""
    found: set[str] = set()
    span = _userinfo(url)
    if span is not None and ":" in url[span[0]:span[1]]:
        found.add(url[span[0]:span[1]].split(":", 1)[1])
    for part in _split(url)[1].split("&"):
        name, _, value = part.partition("=")
        key = unquote(name).lower()
        if key.endswith("password") and value:
            found.add(value)
        elif key == "listen_url" and value:
            found.update(secrets_of(unquote(value)))
    found |= {unquote(s) for s in found}
    return sorted((s for s in found if len(s) >= 2), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
