"""Checks made before a credential or an image leaves the process: where a key may be sent
(``safe_base_url``), whether a base URL and a key can be sent at all (``check_base_url``,
``check_api_key``; a base URL with userinfo, a query or a fragment cannot: ``base_url_extras``),
what may be shown of a URL (``display_url``), which images go out."""

from __future__ import annotations

import ipaddress
import os
import re
from urllib.parse import SplitResult, urlsplit

from .errors import ConfigurationError

SUPPORTED_IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})

_NAMES = {" ": "a space", "\t": "a tab", "\n": "a newline", "\r": "a carriage return"}


def _split(url: str) -> SplitResult | None:
    try:
        return urlsplit(url)
    except ValueError:  # "http://[invalid": an unclosed IPv6 bracket
        return None


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a URL's hostname: no port, IPv6 without brackets) is this machine:
    ``localhost``, ``127.0.0.0/8`` or ``::1``. A name that merely starts with one of them
    (``localhost.example``, ``127.0.0.1.example``) is not."""
    host = host.lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str | None) -> bool:
    """Whether ``url`` points at a loopback host (any scheme): a local model server."""
    parts = _split(url or "")
    return parts is not None and is_loopback_host(parts.hostname or "")


def safe_base_url(url: str | None) -> bool:
    """Whether a base URL is safe to send an API key to.

    https anywhere, or plain http only to the loopback host (a local model server), where
    traffic never leaves the machine. Empty means "the provider default" and is safe. A URL
    that cannot be parsed is not safe (``check_base_url`` says what is wrong with it).
    """
    if not url:
        return True
    parts = _split(url)
    if parts is None:
        return False
    if parts.scheme == "https":
        return bool(parts.hostname)
    if parts.scheme == "http":
        return is_loopback_host(parts.hostname or "")
    return False


def display_url(url: str) -> str:
    """``scheme://host[:port]/path`` of ``url``: never userinfo or a query, which may hold
    credentials, so it is safe in an error message. An unparseable URL shows as
    ``scheme://(unparseable)``."""
    parts = _split(url)
    if parts is None:
        return f"{url.partition(':')[0][:16]}://(unparseable)"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _describe(ch: str) -> str:
    if ch in _NAMES:
        return _NAMES[ch]
    if ch.isspace():
        return f"a whitespace character (U+{ord(ch):04X})"
    if not ch.isascii():
        return f"a non-ASCII character (U+{ord(ch):04X})"
    return f"a control character (U+{ord(ch):04X})"


def base_url_problem(url: str) -> str | None:
    """What keeps an HTTP client from sending to ``url``, in words safe to show (never a
    part of the URL), or None. Checks what ``safe_base_url`` does not: whitespace and control
    characters anywhere (``urlsplit`` silently drops tabs and newlines, httpx refuses them),
    an unclosed IPv6 bracket, a port outside 0-65535. (The scheme and the host are
    ``safe_base_url``'s to judge.)"""
    for i, ch in enumerate(url):
        if ch.isspace() or not ch.isprintable():
            return f"it contains {_describe(ch)} at position {i}"
    parts = _split(url)
    if parts is None:
        return "it cannot be parsed as a URL (an IPv6 host needs both brackets: http://[::1]:8080)"
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        return "its port must be a number from 0 to 65535"
    return None


def base_url_extras(url: str) -> list[str]:
    """The parts of ``url`` a base URL must not have, each with why, in words safe to show
    (never the part itself: a password, a token in a query). A request goes to the base URL
    followed by the API's path, so:

    - userinfo (``user:password@``) makes httpx send Basic auth in place of the key's header;
    - a query (``?``) would swallow that path (and Azure's ``api-version``);
    - a fragment (``#``) is never sent, nor is the path after it: the API's root gets the
      request."""
    parts = _split(url)
    if parts is None:
        return []
    extras = []
    if "@" in parts.netloc:
        extras.append("a user name or password ('user:password@'), which httpx would send as "
                      "Basic auth in place of the API key: remove it (a credential goes in "
                      "api_key= or the provider's key variable)")
    if "?" in url:
        extras.append("a query ('?...'), which the API's path would be appended to: remove it")
    if "#" in url:
        extras.append("a fragment ('#...'), which is never sent, nor the API's path after it: "
                      "remove it")
    return extras


def check_base_url(url: str, provider: str, what: str = "base URL") -> None:
    """Raise ``ConfigurationError`` naming the problem if ``url`` is unusable
    (``base_url_problem``), unsafe for a key (``safe_base_url``), or has a part a base URL
    must not (``base_url_extras``). ``what`` is its name in the message (Azure's
    ``endpoint``)."""
    problem = base_url_problem(url)
    if problem is not None:
        raise ConfigurationError(f"unusable {provider} {what} {display_url(url)!r}: {problem}")
    if not safe_base_url(url):
        raise ConfigurationError(
            f"refusing to send the {provider} API key to {display_url(url)!r}: the {what} "
            "must be https, or http to a loopback host (127.0.0.1, ::1, localhost)"
        )
    extras = base_url_extras(url)
    if extras:
        raise ConfigurationError(
            f"unusable {provider} {what} {display_url(url)!r}: it has "
            + "; and ".join(extras))


def check_api_key(key: str, provider: str) -> None:
    """Raise ``ConfigurationError`` if ``key`` cannot go in an HTTP header as is: every
    character must be printable ASCII, without spaces. The message names the character's
    kind and position, never the key."""
    for i, ch in enumerate(key):
        if not ("!" <= ch <= "~"):
            where = "at its end" if i == len(key) - 1 else f"at position {i}"
            hint = (" (a trailing newline from a file?)" if ch in "\r\n" and i >= len(key) - 2
                    else " (pasted with a quote or a look-alike character?)"
                    if not ch.isascii() else "")
            raise ConfigurationError(
                f"the {provider} API key contains {_describe(ch)} {where}{hint}: an API key "
                "is printable ASCII without spaces"
            )


def supported_image_media_type(media_type: str) -> bool:
    """Whether every vision backend we target accepts this type (png, jpeg, gif, webp)."""
    return media_type.strip().lower() in SUPPORTED_IMAGE_MEDIA_TYPES


_SECRET_NAME = re.compile(r"(API_KEY|_TOKEN|_SECRET)$")


def _secrets() -> list[str]:
    """The values a message must never show: the provider keys of the environment and of
    ``.env``, and anything else named like a key (6 characters or more), longest first."""
    from .config import PROVIDER_VARS, read_dotenv

    names = {v.api_key for v in PROVIDER_VARS.values()}
    values = {v for k, v in os.environ.items() if k in names or _SECRET_NAME.search(k)}
    try:
        dotenv = read_dotenv(".env")
    except OSError:
        dotenv = {}
    values |= {v for k, v in dotenv.items() if k in names or _SECRET_NAME.search(k)}
    return sorted((v for v in values if len(v) >= 6), key=len, reverse=True)


def redact_secrets(text: str) -> str:
    """``text`` with every known secret replaced by ``[redacted]``: for what leaves the
    process (an error line, an eval report, a transcript)."""
    for secret in _secrets():
        text = text.replace(secret, "[redacted]")
    return text
