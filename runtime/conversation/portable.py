"""``portable_id`` and ``LLM.restore``: a conversation as a self-contained string.

The string is ``cdllm1.`` followed by the base64url (unpadded) of the zlib-compressed compact
JSON of a recipe: version, model (name and provider, or an import path), reasoning effort,
system prompts, the default prompt's switch, the history (port messages, exact JSON round
trip), the usage, and the bindings as they stand now: each object bound with ``with_tools``
by its type's import path (``module:qualname``) and its current state, MCP servers by
command, skills by directory, blocked functions, static mode. Superseded state (objects a
tool call replaced, re-bound toolsets) is never in it: the state is kept flattened.

An object's state can be saved when it is a dataclass or a pydantic model (saved with
pydantic, rebuilt with pydantic, so a tuple field comes back a tuple) or has no instance
state at all; anything else, and types that cannot be imported (defined in a function or in
``__main__``), are refused with the reason. So is a workspace: a running pattern instance
lives in its process. The id holds MCP servers' ``env`` values: treat it as a secret then.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import zlib
from pathlib import Path
from typing import Any

import pydantic

from ..llm.types import AUTO, Message, ToolChoice
from .errors import PortableIdError
from .model_choice import ImportedModel, ModelChoice, import_object
from .object_tools import ObjectBinding
from .state import State, TokenUsage

__all__ = ["PREFIX", "dump", "load"]

PREFIX = "cdllm1."
_VERSION = 1
_MESSAGES = pydantic.TypeAdapter(tuple[Message, ...])


def dump(state: State) -> str:
    """The portable id of ``state`` (``PortableIdError`` for state that cannot be saved)."""
    if state.workspace is not None:
        raise PortableIdError(
            "this conversation is bound to a workspace (a running pattern instance), which "
            "lives in this process: a portable id cannot carry it. Rebind the workspace after "
            "restoring instead (restored.with_workspace(instance))")
    recipe = {
        "v": _VERSION,
        "model": _model(state.model),
        "effort": state.reasoning_effort,
        "system": list(state.system_prompts),
        "default_system": state.default_system_prompt,
        "history": _MESSAGES.dump_python(state.history, mode="json"),
        "usage": dataclasses.asdict(state.usage),
        "objects": [_object(b) for b in state.objects],
        "blocked": sorted(list(p) for p in state.blocked),
        "mcp": [m.to_json() for m in state.mcp],
        "skills": [str(p) for p in state.skills],
        "static": state.static_tools,
        "key": state.key,
        "labels": list(state.labels),
    }
    if state.tool_choice != AUTO:  # only when set: earlier ids hold none, and read as auto
        recipe["tool_choice"] = state.tool_choice.model_dump(mode="json")
    raw = json.dumps(recipe, ensure_ascii=False, separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def load(portable_id: str, model: Any = None) -> State:
    """The state a portable id describes (``PortableIdError`` for one that is not);
    ``model`` (a name or a Model), when given, replaces the recorded model."""
    if not isinstance(portable_id, str) or not portable_id.startswith(PREFIX):
        head = portable_id[:12] if isinstance(portable_id, str) else type(portable_id).__name__
        raise PortableIdError(
            f"not a conversation's portable id (it starts {PREFIX!r}; got {head!r}...): pass "
            "the string LLM.portable_id gave")
    body = portable_id[len(PREFIX):]
    try:
        raw = zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        recipe = json.loads(raw)
    except (binascii.Error, zlib.error, ValueError) as e:
        raise PortableIdError(f"this portable id is damaged (cut short or edited?): "
                              f"{type(e).__name__}") from None
    if not isinstance(recipe, dict) or recipe.get("v") != _VERSION:
        raise PortableIdError(f"portable id version {recipe.get('v')!r} is not one this "
                              f"version reads ({_VERSION})")
    try:
        return _state(recipe, model)
    except PortableIdError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise PortableIdError(f"this portable id does not describe a conversation: "
                              f"{type(e).__name__}: {e}") from None


def _model(choice: ModelChoice) -> dict[str, Any]:
    return choice.portable()


def _object(binding: ObjectBinding) -> dict[str, Any]:
    obj = binding.obj
    cls = type(obj)
    where = f"{cls.__module__}:{cls.__qualname__}"
    # what the object is decides first, where its class lives second: the same object gives
    # the same refusal from a module, a test or a pasted script (whose classes are __main__)
    if dataclasses.is_dataclass(obj) or isinstance(obj, pydantic.BaseModel):
        state: Any = pydantic.TypeAdapter(cls).dump_python(obj, mode="json")
    elif not getattr(obj, "__dict__", None) and not getattr(cls, "__slots__", ()):
        state = None  # no instance state: the type alone rebuilds it
    else:
        raise PortableIdError(
            f"the {cls.__name__} bound with with_tools holds state a portable id cannot save: "
            "make it a dataclass or a pydantic model (its fields are saved and rebuilt), or "
            "bind it again after restoring")
    if "<locals>" in cls.__qualname__:
        raise PortableIdError(
            f"the object bound with with_tools is a {cls.__name__} ({where}), defined in a "
            "function, which another process cannot import: define the class at the top "
            "level of an importable module")
    if cls.__module__ == "__main__":
        raise PortableIdError(
            f"the object bound with with_tools is a {cls.__name__} defined in the script "
            f"being run ({where}), which another process cannot import: move the class into "
            "a module of its own (notes.py) and import it from there")
    return {"type": where, "state": state, "except": sorted(binding.except_)}


def _state(recipe: dict[str, Any], override: Any) -> State:
    model = recipe["model"]
    if override is not None:
        choice = ModelChoice(override)
    elif "import" in model:
        choice = ModelChoice(ImportedModel(model["import"]))
    elif model.get("provider") == "scripted":
        raise PortableIdError(
            "this conversation ran on a ScriptedModel, which cannot be rebuilt by name: pass "
            "LLM.restore(portable_id, model=...), or run it on ImportedModel('module:name')")
    else:
        choice = ModelChoice(model.get("name") or None, model.get("provider"))
    objects = []
    for entry in recipe["objects"]:
        try:
            cls = import_object(entry["type"])
        except (ImportError, AttributeError, ValueError) as e:
            raise PortableIdError(f"cannot import the bound object's type {entry['type']!r}: "
                                  f"{type(e).__name__}: {e}") from None
        obj = cls() if entry["state"] is None else \
            pydantic.TypeAdapter(cls).validate_python(entry["state"])
        objects.append(ObjectBinding(obj, frozenset(entry["except"])))
    mcp = ()
    if recipe["mcp"]:
        from .mcp import MCPServer

        mcp = tuple(MCPServer.from_json(m) for m in recipe["mcp"])
    return State(
        model=choice,
        reasoning_effort=recipe["effort"],
        system_prompts=tuple(recipe["system"]),
        default_system_prompt=recipe["default_system"],
        history=_MESSAGES.validate_python(recipe["history"]),
        usage=TokenUsage(**recipe["usage"]),
        objects=tuple(objects),
        blocked=frozenset(tuple(p) for p in recipe["blocked"]),
        mcp=mcp,
        skills=tuple(Path(p) for p in recipe["skills"]),
        static_tools=recipe["static"],
        key=recipe["key"],
        labels=tuple(recipe["labels"]),
        tool_choice=ToolChoice.model_validate(recipe.get("tool_choice", "auto")),
    )
