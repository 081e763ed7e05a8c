"""Where a link may enter: the one policy, which every writer of the cell graph calls.

A link (``{"@link": "/<id>/<path>"}``, plus ``"scope"`` for a per-user or per-session
target; the form is ``jsonpath.is_link``) makes a place in one document an alias of a place
in another. So planting one is a capability: an event, a handler or a model that could write
any link could turn a cell it was given into a view of another instance's (or another
user's) document. The rules, each decided here and nowhere else:

- **Reach.** A document in a scope may link only to the scopes it can see (``reachable_scopes``:
  shared documents to shared ones; a user's also to that user's; a session's also to its
  own and its user's). ``parse_link`` enforces it on every link followed or written.
- **Admission.** A link arriving *in data* (a written value, an event, a model's input) is
  admitted only where the schema at the place it lands asks for one (``{"asCell": true}``,
  ``schema.asks_for_link``); a link *made by code* (a ``Cell`` written as a value) anywhere.
  A value that would become a link one key at a time (writing ``"@link"`` into an object)
  is a link in data.
- **Target.** Every link written must be followable from the document that holds it (its
  scope reachable, its target there, no cycle) and must not point into itself.
- **Input from outside the graph** (``admit_links``): where a link is asked for, a string that
  spells one (``"/<id>/<path>"``, or JSON text of a link) is read as one, and each admitted
  link is resolved by the caller (who knows which scopes the writer may see) and written
  with its scope explicit.

Callers: ``cell.accept_json`` (every cell write and pattern arguments), the scheduler's
event check, ``Transaction.write`` (assembled links), and the builtins' model input
(``runtime/builtins/management.py``, through ``admit_links``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import LinkError
from ..storage import DocKey
from .jsonpath import LINK, Path, is_link, parse_pointer, pointer
from .schema import asks_for_link, subschema
from .scope import Scope

if TYPE_CHECKING:
    from .documents import Documents

__all__ = ["Resolver", "admit_links", "admits_link", "as_link", "check_assembled", "check_event",
           "check_written", "make_link", "parse_link", "reachable_scopes"]

Resolver = Callable[[dict[str, Any], tuple[str, ...]], dict[str, Any]]
"""``resolve(link, scopes)``: the link as it should be stored (its scope explicit), looked
up only in ``scopes``; raises when it leads nowhere the writer may reach."""


# ---------------------------------------------------------------------------- reach


def reachable_scopes(scope_key: str) -> tuple[str, ...]:
    """The scope keys a document filed under ``scope_key`` may link to (itself included);
    a key no ``Scope`` produces reaches only shared documents."""
    try:
        return Scope.parse(scope_key).reachable
    except LinkError:
        return ("",)


def parse_link(link: dict[str, Any], base: DocKey) -> tuple[DocKey, Path]:
    """``{"@link": "/<id>/<path>", "scope": "user:alice"?}`` -> (document key, path).

    A link may point only into its own space, at a scope the document holding it may
    reach (``reachable_scopes``): never into another user's or session's documents.
    """
    try:
        tokens = parse_pointer(link[LINK])
    except ValueError:
        tokens = ()
    if not tokens or not tokens[0]:
        raise LinkError(f"malformed link {_short(link)}: expected {{'@link': '/<id>/<path>'}}")
    scope = link.get("scope", "")
    if not isinstance(scope, str) or scope not in reachable_scopes(base.scope):
        raise LinkError(
            f"link to /{tokens[0]} refused: its scope {_short(scope)} is not reachable from "
            f"{'shared documents' if not base.scope else base.scope} (links may not cross "
            "into another user's or session's documents)"
        )
    return DocKey(base.space, scope, str(tokens[0])), tokens[1:]


def make_link(key: DocKey, path: Path) -> dict[str, Any]:
    """The link to ``path`` of document ``key`` (with its scope when it has one)."""
    link: dict[str, Any] = {LINK: f"/{key.id}{pointer(path)}" if path else f"/{key.id}"}
    if key.scope:
        link["scope"] = key.scope
    return link


# ---------------------------------------------------------------------------- admission


def admits_link(schema: dict[str, Any] | None, path: Path = ()) -> bool:
    """May a link in data land at ``path`` of a value whose schema is ``schema``?"""
    return asks_for_link(subschema(schema, path))


def check_written(docs: Documents, value: Any, where: Callable[[], str], key: DocKey,
                  path: Path, schema: dict[str, Any] | None, links: Iterable[Path],
                  made: Iterable[Path]) -> None:
    """Check the links of ``value`` (plain JSON about to be written at ``path`` of document
    ``key``, whose schema is ``schema``): ``links`` are the paths (inside ``value``) of links
    found in the data, admitted only where the schema asks for one; ``made`` those made by
    code (from a ``Cell``). Each must be followable from ``key`` and not point into itself.
    Raises ``LinkError`` naming the place and the fix."""
    links = tuple(links)
    for at in links:
        if not admits_link(schema, (*path, *at)):
            raise LinkError(
                f"{where()}{pointer(at)} is a link {_at(value, at)!r}, and links in data are "
                "refused where the schema does not ask for one: pass the Cell itself "
                "(cell.set(other_cell)) or give the schema {'asCell': true} there"
            )
    for at in (*links, *made):
        link = _at(value, at)
        full = (*path, *at)
        target, tpath = parse_link(link, key)
        if target == key and tpath[: len(full)] == full:
            raise LinkError(f"{where()}{pointer(at)} links into itself: {link!r}")
        docs.resolve(target, tpath)  # it must lead somewhere, without a cycle


def check_event(links: Iterable[Path], schema: dict[str, Any] | None, name: str) -> None:
    """Refuse the links found in an event for the stream ``name`` (their paths) that land
    where the handler's event schema ``schema`` does not ask for one. (An admitted link is
    followed from the stream's own document when the handler runs, so its reach is checked
    then.)"""
    for at in links:
        if not admits_link(schema, at):
            raise LinkError(
                f"event for {name}{pointer(at)} is a link, and events may carry links only "
                "where the handler's event schema asks for one ({'asCell': true}); send the "
                "data itself"
            )


def check_assembled(key: DocKey, schema: dict[str, Any] | None, describe: str, path: Path,
                    parent: dict[str, Any], value: Any) -> None:
    """Writing ``value`` at ``path`` (its last step ``"@link"`` or ``"scope"``) into the
    object ``parent`` of document ``key`` can turn that object into a link one key at a
    time: that is a link written from data, admitted only where the schema asks for one,
    and never into itself. ``describe`` names the document for the error."""
    candidate = {**parent, str(path[-1]): value}
    if not is_link(candidate):
        return
    if not admits_link(schema, path[:-1]):
        raise LinkError(
            f"writing {pointer(path)} of {describe} would turn the object there into a "
            "link, and links in data are refused where the schema does not ask for one: "
            "write a Cell at the parent (parent.set(other_cell)) or give the schema "
            "{'asCell': true} there"
        )
    target, tpath = parse_link(candidate, key)
    if target == key and tpath[: len(path) - 1] == path[:-1]:
        raise LinkError(f"{pointer(path[:-1])} of {describe} would link into itself")


def admit_links(value: Any, schema: dict[str, Any] | None, holder_scope: str,
                resolve: Resolver, *, where: str = "value", at: Path = ()) -> Any:
    """``value`` from outside the graph (a model's tool input), to land where ``schema``
    describes in a document filed under ``holder_scope``, with its links admitted and
    normalized, or ``LinkError`` naming the first one refused.

    Where the schema asks for a link (``asCell``), a link, or a string spelling one (see
    ``as_link``), becomes ``resolve(link, reachable_scopes(holder_scope))``: the caller
    narrows those scopes to what the writer itself may see, finds the target and returns
    the link to store (``make_link``), or raises. Anywhere else a link is refused, and a
    string stays a string. ``at`` is where ``value`` sits, for the error text."""
    asks = asks_for_link(schema)
    if isinstance(value, str):
        if not asks:
            return value
        link = as_link(value)
        return value if link is None else resolve(link, reachable_scopes(holder_scope))
    if isinstance(value, dict):
        if is_link(value):
            if not asks:
                raise LinkError(
                    f"{where}{pointer(at)} is a link, and links are accepted only where the "
                    "schema asks for a cell (asCell); send the data itself (read it first if "
                    "you need it).")
            return resolve(value, reachable_scopes(holder_scope))
        return {k: admit_links(v, subschema(schema, (k,)), holder_scope, resolve,
                               where=where, at=(*at, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [admit_links(v, subschema(schema, (i,)), holder_scope, resolve, where=where,
                            at=(*at, i)) for i, v in enumerate(value)]
    return value


def as_link(raw: Any) -> dict[str, Any] | None:
    """A path as someone outside the graph writes it, as a link: ``"/<id>/<path>"``, a link
    ``{"@link": ..., "scope"?: ...}``, or JSON text of one; None if it is none of these."""
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("{"):
            try:
                raw = json.loads(text)
            except ValueError:
                return None
        elif text.startswith("/"):
            return {LINK: text}
        else:
            return None
    if isinstance(raw, dict) and isinstance(raw.get(LINK), str):
        if set(raw) <= {LINK, "scope"} and isinstance(raw.get("scope", ""), str):
            return dict(raw)
    return None


def _at(value: Any, path: Path) -> Any:
    for t in path:
        value = value[t]
    return value


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
