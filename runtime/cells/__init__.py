"""The cell graph: the reactive kernel, documents and transactions, cells and streams, the
event scheduler, patterns and the ``Runtime`` that owns them. Persists through
``runtime.storage``; knows nothing of LLMs (``runtime.llm``).

This module is the graph's one front for the rooms above it (``runtime/builtins``, the
CLI, the evaluator): everything they use is named here, so none of them imports a submodule
or reaches for an underscore attribute. What they need beyond applications' API:

- what runs where, by document (indexes, not scans): ``Runtime.instance_of(key)``,
  ``Runtime.stream_at(key)``, ``Runtime.pattern_at(key, path)``; ``Stream.key`` /
  ``Stream.scope`` and ``Cell.doc_key``;
- building a node: ``BuiltinNode`` (and its ``Record``), ``Transaction`` (``rt.begin()``),
  ``current_runtime``;
- values, paths and links: ``MISSING``, ``Path``, ``pointer``, ``parse_pointer``,
  ``is_link``, ``make_link``, ``parse_link``, ``Scope``, ``DocKey``, and the markers a
  result holds (``PATTERN_REF``, ``STREAM_MARKER``);
- the one link-admission policy (``runtime/cells/links.py``): ``admit_links`` for input from
  outside the graph, ``as_link``, ``reachable_scopes``, ``admits_link``;
- schemas: ``SchemaLike``, ``to_json_schema``, ``validate``, ``subschema``,
  ``asks_for_link``; ids: ``canonical``; strict JSON equality: ``same``; the JSON text of
  dict objects seen lately (a cache key made once per object): ``TextByObject``.
"""

from ..errors import (
    BindingError,
    CellError,
    CycleError,
    LinkError,
    NotJSONError,
    PathError,
    PatternError,
    ReadOnlyError,
    SchemaError,
    ScopeError,
    StreamError,
    UsageError,
    WriteInComputationError,
)
from ..storage import DocKey
from .builtin import BuiltinNode, Record
from .by_object import TextByObject
from .cell import STREAM_MARKER, Cell, Stream
from .documents import Change, Transaction
from .equality import same
from .ids import canonical
from .jsonpath import MISSING, Path, is_link, own_json, parse_pointer, pointer
from .links import (
    Resolver,
    admit_links,
    admits_link,
    as_link,
    make_link,
    parse_link,
    reachable_scopes,
)
from .pattern import Handler, Pattern, cell, computed, handler, lift, pattern
from .registry import PATTERN_REF
from .runtime import Instance, Runtime, current_instance, current_runtime
from .schema import SchemaLike, asks_for_link, subschema, to_json_schema, validate
from .scope import Scope
from .timers import Timer

__all__ = [
    "MISSING",
    "PATTERN_REF",
    "STREAM_MARKER",
    "BindingError",
    "BuiltinNode",
    "Cell",
    "CellError",
    "Change",
    "CycleError",
    "DocKey",
    "Handler",
    "Instance",
    "LinkError",
    "NotJSONError",
    "Path",
    "PathError",
    "Pattern",
    "PatternError",
    "ReadOnlyError",
    "Record",
    "Resolver",
    "Runtime",
    "SchemaError",
    "SchemaLike",
    "Scope",
    "ScopeError",
    "Stream",
    "StreamError",
    "TextByObject",
    "Timer",
    "Transaction",
    "UsageError",
    "WriteInComputationError",
    "admit_links",
    "admits_link",
    "as_link",
    "asks_for_link",
    "canonical",
    "cell",
    "computed",
    "current_instance",
    "current_runtime",
    "handler",
    "is_link",
    "lift",
    "make_link",
    "own_json",
    "parse_link",
    "parse_pointer",
    "pattern",
    "pointer",
    "reachable_scopes",
    "same",
    "subschema",
    "to_json_schema",
    "validate",
]
