"""Scopes: which copy of a document a user or a session sees.

A ``Scope`` is a value: shared (the whole space), one user's, or one session's (of a user,
or of no user). Its ``key`` is what the store files documents under, and it is built so that
no two distinct (user, session) pairs ever share a key, whatever characters the ids contain:
each id is percent-encoded (``%``, ``:`` and ``/`` included) before the parts are joined with
``:``, which an encoded id can no longer contain. Ids are opaque strings chosen by the
application; an empty or non-string id is refused.

``reachable`` is what a document in the scope may link to: shared documents only shared
ones; a user's documents also that user's; a session's also its own and its user's. So a
link written by someone (or sent in an event) can never reach another user's or session's
documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote

from ..errors import LinkError, ScopeError

__all__ = ["SHARED", "Scope"]


def _check_id(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise ScopeError(
            f"{what} must be a string, got {type(value).__name__} {value!r}; ids are opaque "
            "strings chosen by the application (str(...) a number first)"
        )
    if not value:
        raise ScopeError(f"{what} must not be empty; pass None for no {what}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ScopeError(
            f"{what} {value!r} is not valid Unicode text (it holds a lone surrogate)"
        ) from None
    return value


def _enc(text: str) -> str:
    return quote(text, safe="")


@lru_cache(maxsize=4096)
def _key(user: str | None, session: str | None) -> str:
    """A scope's key, made once per scope in use (every document and link of an instance
    asks for it; percent-encoding is slow)."""
    if session is not None:
        return f"session:{_enc(user or '')}:{_enc(session)}"
    if user is not None:
        return f"user:{_enc(user)}"
    return ""


@dataclass(frozen=True, slots=True)
class Scope:
    """Shared (both None), a user's (``user``), or a session's (``session``, with or without
    its ``user``)."""

    user: str | None = None
    session: str | None = None

    @classmethod
    def of(cls, user: object = None, session: object = None) -> Scope:
        """The scope for ``rt.run(..., user=, session=)``, with the ids checked."""
        return cls(None if user is None else _check_id("user", user),
                   None if session is None else _check_id("session", session))

    @property
    def key(self) -> str:
        """The store's scope key: ``""``, ``"user:<u>"``, ``"session:<u>:<s>"`` or
        ``"session::<s>"`` (ids percent-encoded)."""
        return _key(self.user, self.session)

    @classmethod
    def parse(cls, key: str) -> Scope:
        """The scope a key names; ``LinkError`` if it is not one ``key`` could produce."""
        if key == "":
            return SHARED
        kind, sep, rest = key.partition(":")
        if sep and kind == "user" and rest and ":" not in rest:
            return cls(unquote(rest), None)
        if sep and kind == "session":
            user, sep2, session = rest.partition(":")
            if sep2 and session and ":" not in session:
                return cls(unquote(user) if user else None, unquote(session))
        raise LinkError(f"{key[:80]!r} is not a scope key")

    def narrowest(self, other: Scope) -> Scope:
        """The narrower of two scopes on one path (shared < user < session); the two must
        be on one path (a user's scope and that user's session, say)."""
        if other.key in self.reachable:
            return self
        if self.key in other.reachable:
            return other
        raise ScopeError(f"scopes {self.key!r} and {other.key!r} do not nest")

    @property
    def reachable(self) -> tuple[str, ...]:
        """The scope keys a document in this scope may link to (itself included)."""
        if self.session is not None:
            if self.user is not None:
                return ("", Scope(self.user).key, self.key)
            return ("", self.key)
        if self.user is not None:
            return ("", self.key)
        return ("",)

    def __str__(self) -> str:
        if self.session is not None:
            return f"session {self.session!r}" + (f" of user {self.user!r}" if self.user else "")
        return f"user {self.user!r}" if self.user is not None else "shared"


SHARED = Scope()
