"""Tools from Python objects (``LLM.with_tools(obj)``): each public method is a tool.

A method's JSON Schema comes from its signature's type hints through pydantic, its
description from its docstring. The model's arguments are validated by that same pydantic
model before the call (so a ``datetime`` or a pydantic parameter arrives as one), and a bad
call comes back to the model as an error result saying what was wrong. A method that
returns an instance of the object's own type replaces the object as the state that later
calls run on (immutable objects work as in Dagger: ``add`` returns the new notebook).

Specs are computed once per class (``_specs``): binding, forking and evaluating again cost
a dictionary lookup, not a schema build.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core

from ..llm.steps import ToolError, ToolOutput
from ..llm.types import Tool

__all__ = ["ObjectBinding", "ObjectTools", "method_specs"]

# Methods of these modules' classes are machinery, not the object's own (BaseModel's
# model_dump, Enum's, ...): only what the user's classes define becomes a tool.
_MACHINERY = ("builtins", "pydantic", "typing", "abc", "enum", "collections")


@dataclass(frozen=True, slots=True)
class ObjectBinding:
    """One object bound with ``with_tools``: its current state and the hidden methods."""

    obj: Any
    except_: frozenset[str] = frozenset()

    @property
    def type_name(self) -> str:
        return type(self.obj).__name__


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """What one method is as a tool (its schema, its argument model, how to call it)."""

    name: str
    description: str
    schema: dict[str, Any]
    arguments: type[pydantic.BaseModel]
    params: tuple[tuple[str, str, bool], ...]  # (field, parameter, positional only)
    is_async: bool
    tool: Tool  # under its own name; one object for every evaluation (engine caches by it)


def method_specs(cls: type) -> dict[str, MethodSpec]:
    """The tool specs of ``cls``'s public methods (cached per class); raises ``TypeError``
    naming the method for a signature that cannot be a tool."""
    return _specs(cls)


@functools.lru_cache(maxsize=512)
def _specs(cls: type) -> dict[str, MethodSpec]:
    out: dict[str, MethodSpec] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__.split(".")[0] in _MACHINERY:
            continue
        for name, attr in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_"):
                continue
            fn = attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr
            if inspect.isfunction(fn):
                out[name] = _spec(cls, name, fn, skip_first=not isinstance(attr, staticmethod))
    return out


def _spec(cls: type, name: str, fn: Any, *, skip_first: bool) -> MethodSpec:
    where = f"{cls.__name__}.{name}"
    params = list(inspect.signature(fn).parameters.values())[1 if skip_first else 0:]
    hints = _hints(cls, fn, where)
    fields: dict[str, Any] = {}
    order: list[tuple[str, str, bool]] = []
    for i, p in enumerate(params):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(
                f"{where} takes *{p.name}: a tool needs named parameters. Give it explicit "
                f"parameters, or hide it with with_tools(obj, except_=({name!r},))")
        annotation = hints.get(p.name, Any)
        default = ... if p.default is p.empty else p.default
        field = f"p{i}"  # the parameter's name is the alias: any name works (even 'json')
        fields[field] = (annotation, pydantic.Field(default, alias=p.name))
        order.append((field, p.name, p.kind is p.POSITIONAL_ONLY))
    try:
        model = pydantic.create_model(f"{cls.__name__}_{name}_arguments", **fields)
        schema = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic_core.SchemaError, TypeError) as e:
        raise TypeError(
            f"{where}: its parameters have no JSON Schema ({e}). Use JSON-friendly type hints "
            f"(str, int, lists, dataclasses, pydantic models), or hide it with "
            f"except_=({name!r},)") from None
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    doc = inspect.getdoc(fn) or f"{where}."
    return MethodSpec(name, doc, schema, model, tuple(order), inspect.iscoroutinefunction(fn),
                      Tool(name=name, description=doc, input_schema=schema))


def _hints(cls: type, fn: Any, where: str) -> dict[str, Any]:
    """The parameters' type hints, strings resolved in the method's module and against
    the class's own name (a return annotation that does not resolve is not needed)."""
    local = {cls.__name__: cls}
    try:
        return typing.get_type_hints(fn, localns=local, include_extras=True)
    except Exception:
        pass
    out: dict[str, Any] = {}
    for pname, ann in getattr(fn, "__annotations__", {}).items():
        if pname == "return":
            continue
        if isinstance(ann, str):
            try:
                ann = eval(ann, dict(getattr(fn, "__globals__", {})), local)
            except Exception as e:
                raise TypeError(f"{where}: cannot resolve the type hint {ann!r} of parameter "
                                f"{pname!r} ({type(e).__name__}: {e})") from None
        out[pname] = ann
    return out


@dataclass(slots=True)
class _Route:
    index: int  # which bound object
    spec: MethodSpec


class ObjectTools:
    """The methods of the bound objects as tools, for one evaluation (a ``Toolset``).

    Method names that two bound objects share are prefixed with the type name
    (``Notes_add``, ``Todo_add``); ``blocked`` holds ``(type name, method)`` pairs hidden by
    ``with_blocked_function``. ``objects`` is the current state of each binding: a call that
    returns the object's own type replaces it there."""

    def __init__(self, bindings: Sequence[ObjectBinding],
                 blocked: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.objects: list[Any] = [b.obj for b in bindings]
        per_object: list[dict[str, MethodSpec]] = []
        count: dict[str, int] = {}
        for b in bindings:
            specs = {n: s for n, s in method_specs(type(b.obj)).items()
                     if n not in b.except_ and (b.type_name, n) not in blocked}
            per_object.append(specs)
            for n in specs:
                count[n] = count.get(n, 0) + 1
        self._routes: dict[str, _Route] = {}
        self.tools: list[Tool] = []
        for i, (b, specs) in enumerate(zip(bindings, per_object, strict=True)):
            for n, spec in specs.items():
                name = f"{b.type_name}_{n}" if count[n] > 1 else n
                self._routes[name] = _Route(i, spec)
                self.tools.append(spec.tool if name == n else spec.tool.model_copy(
                    update={"name": name}))

    async def list_tools(self) -> list[Tool]:
        return self.tools

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutput:
        route = self._routes[name]
        spec = route.spec
        try:
            parsed = spec.arguments.model_validate(arguments)
        except pydantic.ValidationError as e:
            raise ToolError(f"Invalid arguments for tool {name!r}: "
                            f"{_short(e)}. Its JSON Schema: {spec.schema}") from None
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for field, param, positional in spec.params:
            value = getattr(parsed, field)
            if positional:
                args.append(value)
            else:
                kwargs[param] = value
        state = self.objects[route.index]
        result = getattr(state, spec.name)(*args, **kwargs)
        if spec.is_async or inspect.isawaitable(result):
            result = await result
        if isinstance(result, type(state)):
            self.objects[route.index] = result
            return _replaced(result)
        return result

    async def aclose(self) -> None:
        pass


def _replaced(new: Any) -> ToolOutput:
    """What the model reads when a call replaced the state: the new state if it is JSON."""
    kind = type(new).__name__
    try:
        value = pydantic_core.to_json(new).decode()
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError):
        return f"Done: the {kind} returned is now the state for later calls."
    return f"Done: the {kind} returned is now the state for later calls: {value}"


def _short(e: pydantic.ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        where = "/".join(str(x) for x in err.get("loc", ())) or "the top level"
        parts.append(f"at {where}, {err.get('msg', 'invalid')}")
    return "; ".join(parts)
