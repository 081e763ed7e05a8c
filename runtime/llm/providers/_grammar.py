"""The local model's reply grammar: a text answer, or one call of one advertised tool.

A small model left to itself writes calls that do not parse, name tools that do not exist or
pass arguments of the wrong shape. Under this grammar (llama.cpp GBNF) it cannot: its reply is
either text or exactly::

    <tool_call>
    {"name": "<an advertised tool>", "arguments": <JSON its schema accepts>}
    </tool_call>

Each tool's arguments are compiled by llama-cpp-python's own JSON-Schema converter
(``llama_cpp.llama_grammar.SchemaConverter``, the engine of ``json_schema_to_gbnf``); what is
ours is only the choice around them, the call's frame, and knowing which schema keywords that
converter renders exactly. A keyword it would drop or get wrong (``pattern``, ``minimum``,
``oneOf``...) is taken out of the schema the converter sees: the grammar is then looser than
the schema for that tool, which ``CompiledGrammar.relaxed`` reports (the model logs it), and the
step engine still validates the call when it runs. Text cannot start with ``<`` or white space,
so the first character decides between text and a call.

Rendering a call (``render_call``) and reading one back (``ReplyParser``) use the same frame,
so a conversation's earlier calls reach the model exactly as it would have written them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import Fault, LLMError
from ..events import StreamEvent, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from ..types import Tool

__all__ = [
    "ANSWER_GRAMMAR",
    "CALL_OPEN",
    "CALL_SUFFIX",
    "CompiledGrammar",
    "ReplyParser",
    "call_prefix",
    "compile_tools",
    "relax_schema",
    "render_call",
]

CALL_OPEN = "<tool_call>\n"
ANSWER = r"answer ::= [^<\x00-\x20] [^\x00]*"
ANSWER_GRAMMAR = f"root ::= answer\n{ANSWER}\n"
"""Text only, as the answer of ``compile_tools``: it starts with neither ``<`` nor white
space, so a model that was shown calls and results cannot write one as text."""
CALL_SUFFIX = "}\n</tool_call>"

# Keywords that only annotate: the converter must not see them (a schema holding only a
# title is "anything" to JSON Schema but an error to the converter).
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
    "writeOnly", "$schema", "$id", "format",
})
# What the converter renders exactly, given the conditions ``_relax`` checks.
_FORMATS = frozenset({"date", "time", "date-time", "uuid"})
_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})


def call_prefix(name: str) -> str:
    """The text of a call up to its arguments."""
    return f'{CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": '


def render_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the grammar makes the model write it (for calls already in the history)."""
    return call_prefix(name) + json.dumps(arguments, ensure_ascii=False) + CALL_SUFFIX


def _literal(text: str) -> str:
    """A GBNF string literal."""
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


# -- what the converter can express -----------------------------------------------------


def relax_schema(schema: Any) -> tuple[dict[str, Any], list[str]]:
    """``schema`` without what the converter cannot render exactly, and what was taken out.

    The result admits every value ``schema`` admits (keywords are only removed), and holds no
    annotations. Each entry of the list names a removed keyword by its JSON pointer, so the
    log record says exactly what the grammar does not enforce.
    """
    dropped: list[str] = []
    if not isinstance(schema, dict):
        return {"type": "object"}, ["(the schema is not a JSON object)"]
    relaxed = _relax(schema, "", dropped)
    if relaxed.get("type") != "object" and not ({"properties", "additionalProperties"}
                                                & set(relaxed)):
        # The port's calls carry a JSON object; anything else is framed as one.
        dropped.append("(the top level is not an object schema)")
        relaxed = {"type": "object"}
    return relaxed, dropped


def _relax(node: dict[str, Any], where: str, dropped: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def drop(key: str, why: str = "") -> None:
        dropped.append(f"{where}/{key}" + (f" ({why})" if why else ""))

    for key, value in node.items():
        if key == "format":
            if value in _FORMATS and node.get("type") == "string":
                out[key] = value
            continue  # other formats are annotations (validators do not assert them)
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            types = value if isinstance(value, list) else [value]
            if not types or any(t not in _TYPES for t in types):
                drop(key, "unknown type")
            else:
                out[key] = value
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _sub(sub, f"{where}/properties/{_escape(name)}", dropped)
                        for name, sub in value.items()}
        elif key == "additionalProperties" and isinstance(value, bool | dict):
            out[key] = value if isinstance(value, bool) else _sub(
                value, f"{where}/additionalProperties", dropped)
        elif key == "items" and isinstance(value, dict):
            out[key] = _sub(value, f"{where}/items", dropped)
        elif key == "prefixItems" and isinstance(value, list):
            out[key] = [_sub(s, f"{where}/prefixItems/{i}", dropped) for i, s in enumerate(value)]
        elif key == "anyOf" and isinstance(value, list) and value:
            out[key] = [_sub(s, f"{where}/anyOf/{i}", dropped) for i, s in enumerate(value)]
        elif key in ("$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _sub(sub, f"{where}/{key}/{_escape(name)}", dropped)
                        for name, sub in value.items()}
        elif key in ("required", "enum", "const", "$ref"):
            out[key] = value
        elif key in ("minItems", "maxItems", "minLength", "maxLength") and _count(value):
            out[key] = value
        else:
            drop(key)
    return _check_combinations(out, where, dropped)


def _check_combinations(out: dict[str, Any], where: str, dropped: list[str]) -> dict[str, Any]:
    """Keep only combinations the converter honours in full (it picks one branch per node)."""
    structural = set(out) - {"$defs", "definitions"}

    def only(key: str) -> None:
        for other in sorted(structural - {key}):
            dropped.append(f"{where}/{other} (beside {key})")
            del out[other]

    if "$ref" in out:
        if not isinstance(out["$ref"], str) or not out["$ref"].startswith("#/"):
            dropped.append(f"{where}/$ref (only local references)")
            return {}
        only("$ref")
    elif "const" in out:
        only("const")
    elif "enum" in out:
        if not isinstance(out["enum"], list) or not out["enum"]:
            dropped.append(f"{where}/enum (not a list of values)")
            del out["enum"]
        else:
            only("enum")
    elif "anyOf" in out:
        only("anyOf")
    elif isinstance(out.get("type"), list):
        only("type")
    kind = out.get("type")
    for key in ("minLength", "maxLength"):
        if key in out and (kind != "string" or "format" in out):
            dropped.append(f"{where}/{key}")
            del out[key]
    for key in ("minItems", "maxItems"):
        if key in out and not isinstance(out.get("items"), dict):
            dropped.append(f"{where}/{key} (without items)")
            del out[key]
    if "prefixItems" in out and "items" in out:
        dropped.append(f"{where}/items (beside prefixItems)")
        del out["items"]
    if "required" in out:
        names = out["required"]
        described = out.get("properties", {})
        if not isinstance(names, list) or any(n not in described for n in names):
            dropped.append(f"{where}/required (names a property not described)")
            del out["required"]
    if kind == "object" and "required" not in out and "properties" not in out and (
            out.get("additionalProperties") is True):
        del out["additionalProperties"]  # the same as no keyword at all
    return out


def _sub(schema: Any, where: str, dropped: list[str]) -> Any:
    if isinstance(schema, bool):
        if schema:
            return {}
        dropped.append(f"{where} (false)")
        return {}
    if not isinstance(schema, dict):
        dropped.append(f"{where} (not a schema)")
        return {}
    return _relax(schema, where, dropped)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


# -- the grammar -------------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledGrammar:
    """The GBNF for one set of tools, and per tool what it does not enforce."""

    text: str
    relaxed: dict[str, list[str]] = field(default_factory=dict)


def compile_tools(tools: Sequence[Tool], *, text: bool = True) -> CompiledGrammar:
    """The grammar of a reply when ``tools`` are offered: text, or one call of one of them
    (``text=False``: a call only, as the property test samples calls).

    Raises ``ImportError`` without llama-cpp-python (the converter is its own).
    """
    from llama_cpp.llama_grammar import SchemaConverter

    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                                raw_pattern=False)
    calls: list[str] = []
    relaxed: dict[str, list[str]] = {}
    for i, tool in enumerate(tools):
        schema, dropped = relax_schema(tool.input_schema)
        try:
            schema = converter.resolve_refs(schema, f"tool{i}")
            args = converter.visit(schema, f"tool{i}-args")
        except Exception as e:  # the converter asserts on what it cannot parse
            dropped.append(f"(the converter refused the schema: {type(e).__name__}: {e})")
            args = converter.visit({"type": "object"}, f"tool{i}-any")
        if dropped:
            relaxed[tool.name] = dropped
        calls.append(f"call{i} ::= {_literal(call_prefix(tool.name))} {args} "
                     f"{_literal(CALL_SUFFIX)}")
    choices = (["answer"] if text else []) + [f"call{i}" for i in range(len(tools))]
    rules = [
        "root ::= " + " | ".join(choices),
        # Text starts with neither "<" nor white space: the first character chooses.
        ANSWER,
        *calls,
        converter.format_grammar(),
    ]
    return CompiledGrammar("\n".join(rules) + "\n", relaxed)


# -- reading a reply as it streams ---------------------------------------------------------


class ReplyParser:
    """Turns the decoded text of a reply, piece by piece, into port events.

    With ``tools`` the reply is known to follow the grammar: a first ``<`` means a call, whose
    start is announced once its name is complete and whose arguments stream as they arrive
    (all but the last ``len(CALL_SUFFIX)`` characters, which may be the frame's end). Without
    tools it is text. ``new_id(name)`` gives the call its id.
    """

    def __init__(self, tools: Sequence[Tool], new_id: Callable[[str], str]) -> None:
        self._names = {t.name for t in tools}
        self._grammar = bool(tools)
        self._new_id = new_id
        self._mode: str | None = None if self._grammar else "text"
        self._buffer = ""
        self._sent = 0  # how much of the arguments (after the prefix) went out
        self._prefix = 0  # length of the call's prefix once its name is known
        self._in_string = self._escaped = False
        self.name: str | None = None

    @property
    def in_call(self) -> bool:
        return self._mode == "call"

    def feed(self, piece: str) -> Iterator[StreamEvent]:
        if not piece:
            return
        if self._mode is None:
            self._mode = "call" if piece.startswith("<") else "text"
        if self._mode == "text":
            yield TextDelta(index=0, text=piece)
            return
        self._buffer += piece
        if self.name is None:
            yield from self._start()
        if self.name is not None:
            ready = len(self._buffer) - len(CALL_SUFFIX)
            if ready > self._prefix + self._sent:
                yield self._arguments(self._buffer[self._prefix + self._sent:ready])
                self._sent = ready - self._prefix

    def _arguments(self, text: str) -> ToolCallDelta:
        """Argument text with raw control characters inside strings escaped: the converter's
        string rule admits them, JSON does not (``json.loads`` would refuse a raw newline)."""
        out = []
        for c in text:
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
                elif c < " ":
                    c = json.dumps(c)[1:-1]
            elif c == '"':
                self._in_string = True
            out.append(c)
        return ToolCallDelta(index=0, arguments="".join(out))

    def _start(self) -> Iterator[StreamEvent]:
        head = '{"name": '
        body = self._buffer[len(CALL_OPEN):]
        if not self._buffer.startswith(CALL_OPEN[: len(self._buffer)]):
            raise self._bad("a reply that starts with '<' is not a tool call")
        if len(body) <= len(head) or not body.startswith(head):
            return
        try:  # the name is a JSON string: complete once its closing quote has arrived
            name, end = json.JSONDecoder().raw_decode(body, len(head))
        except json.JSONDecodeError:
            return
        rest = ', "arguments": '
        if len(body) < end + len(rest):
            return
        if body[end:end + len(rest)] != rest or name not in self._names:
            raise self._bad(f"tool call frame broken or tool {name!r} not advertised")
        self.name = name
        self._prefix = len(CALL_OPEN) + end + len(rest)
        yield ToolCallStart(index=0, id=self._new_id(name), name=name)

    def finish(self) -> Iterator[StreamEvent]:
        """The closing events once the reply is complete; raises if a call was cut short."""
        if self._mode != "call":
            return
        if self.name is None or not self._buffer.endswith(CALL_SUFFIX):
            raise LLMError("the reply ended inside a tool call (max_tokens or the context "
                           "window reached): no complete call to run", fault=Fault.TRANSIENT,
                           provider="local")
        end = len(self._buffer) - len(CALL_SUFFIX)
        if end > self._prefix + self._sent:
            yield self._arguments(self._buffer[self._prefix + self._sent:end])
        yield ToolCallEnd(index=0)

    @staticmethod
    def _bad(what: str) -> LLMError:
        return LLMError(f"malformed reply from the local model: {what}",
                        fault=Fault.TRANSIENT, provider="local")
