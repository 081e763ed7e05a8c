"""Checks made before a credential or an image leaves the process."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

SUPPORTED_IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


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
    return is_loopback_host(urlsplit(url or "").hostname or "")


def safe_base_url(url: str | None) -> bool:
    """Whether a base URL is safe to send an API key to.

    https anywhere, or plain http only to the loopback host (a local model server), where
    traffic never leaves the machine. Empty means "the provider default" and is safe.
    """
    if not url:
        return True
    parts = urlsplit(url)
    if parts.scheme == "https":
        return bool(parts.hostname)
    if parts.scheme == "http":
        return is_loopback_host(parts.hostname or "")
    return False


def display_url(url: str) -> str:
    """``scheme://host[:port]/path`` of ``url``: never userinfo or a query, which may hold
    credentials, so it is safe in an error message."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def supported_image_media_type(media_type: str) -> bool:
    """Whether every vision backend we target accepts this type (png, jpeg, gif, webp)."""
    return media_type.strip().lower() in SUPPORTED_IMAGE_MEDIA_TYPES
