"""The port's vocabulary: messages, blocks, tools, requests and responses.

Every model backend speaks these types and nothing else, so the dialog, the conversation
object and the evals never see a vendor's wire format. All are pydantic models whose JSON
round-trip is exact (``Model.model_validate_json(m.model_dump_json()) == m``).

Text here is always Unicode text: every string a user or code puts in the vocabulary (a
block's text, a call's input, a result, the system prompt, a tool's description...) is
refused if it holds a lone UTF-16 surrogate, with the error ``runtime._text`` words, since
a request carrying one cannot be encoded for any provider. Text a provider sends is not
refused but replaced, by the adapters and the assembler, before it becomes these types.
A history also never reuses a tool call's id (``Request`` refuses one that does): the id is
what pairs a call with its result. And a request's ``tool_choice`` only names a tool the
request offers: a choice that no provider could honour is refused here, not by a server.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeAlias, TypeVar

import pydantic_core
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from .._text import describe_surrogate, has_surrogate
from .limits import MAX_TOOL_NAME_CHARS


class _Value(BaseModel):
    """Immutable, strict-keyed base: a typo in a field name is an error, not a silent drop."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )


def _check_text(value: str) -> str:
    if not value.isascii() and has_surrogate(value):  # ASCII, the common case: no call
        raise ValueError(describe_surrogate(value, "the text"))
    return value


def _surrogate_in(value: Any, path: str = "") -> tuple[str, str] | None:
    """(path, string) of the first string in a JSON value, keys included, that holds a lone
    surrogate, or None."""
    t = type(value)
    if t is str:
        return (path or "the top level", value) if has_surrogate(value) else None
    if t is dict:
        for k, v in value.items():
            if type(k) is str and has_surrogate(k):
                return f"the key {path}/{k[:40]!r}", k
            if type(v) in (str, dict, list) and (hit := _surrogate_in(v, f"{path}/{k}")):
                return hit
    elif t is list:
        for i, v in enumerate(value):
            if type(v) in (str, dict, list) and (hit := _surrogate_in(v, f"{path}/{i}")):
                return hit
    return None


def _check_json(value: dict[str, Any]) -> dict[str, Any]:
    try:  # the common case in C: serialising is what fails on a lone surrogate
        pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError:  # that, or a value JSON cannot hold
        if hit := _surrogate_in(value):
            where, text = hit
            raise ValueError(describe_surrogate(text, f"the value at {where[:200]}")) from None
    return value


Text = Annotated[str, AfterValidator(_check_text)]
"""A string that is Unicode text: one holding a lone surrogate is refused (module doc)."""
JSONObject = Annotated[dict[str, Any], AfterValidator(_check_json)]
"""A JSON object whose strings (keys too) are all Unicode text."""


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class StopReason(StrEnum):
    """Why the model ended its turn; ``TOOL_USE`` means run the calls and continue."""

    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    REFUSAL = "refusal"
    CONTEXT_EXCEEDED = "context_exceeded"


class TextBlock(_Value):
    kind: Literal["text"] = "text"
    text: Text


class ToolUse(_Value):
    """The model asks to call a tool; ``id`` pairs it with the ``ToolResult`` that answers it."""

    kind: Literal["tool_use"] = "tool_use"
    id: Text
    name: Text
    input: JSONObject = Field(default_factory=dict)


class ToolResult(_Value):
    """A tool's output fed back to the model; ``is_error`` marks a failed call."""

    kind: Literal["tool_result"] = "tool_result"
    tool_use_id: Text
    content: Text
    is_error: bool = False


class OpaqueBlock(_Value):
    """Provider content we must replay verbatim (thinking blocks and their signatures).

    ``raw`` is the provider's JSON for the block, exactly as received; an adapter splices it
    back unchanged when encoding a request for the same ``provider`` and drops it for others.
    """

    kind: Literal["opaque"] = "opaque"
    provider: Text
    raw: Text


class ImageBlock(_Value):
    """Bitmap content carried inline (bytes plus IANA media type); base64 in JSON."""

    kind: Literal["image"] = "image"
    media_type: str
    data: bytes


Block = Annotated[
    TextBlock | ToolUse | ToolResult | OpaqueBlock | ImageBlock, Field(discriminator="kind")
]


class Message(_Value):
    """One turn of the conversation: a role and its content blocks.

    Not the ``{"role": ..., "content": ...}`` dict of the vendors' APIs: a message in that
    form is refused with a hint towards ``Message.text(role, text)``."""

    role: Role
    blocks: tuple[Block, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _not_a_vendor_dict(cls, data: Any) -> Any:
        if isinstance(data, dict) and "content" in data and "blocks" not in data:
            role, content = data.get("role", "user"), data["content"]
            role = role.value if isinstance(role, Role) else role
            if isinstance(role, str) and isinstance(content, str):
                text = content if len(content) <= 40 else content[:37] + "..."
                example = f"Message.text({role!r}, {text!r})"
            else:
                example = "Message.text(role, text)"
            raise ValueError(
                f"a Message holds blocks, not content (that is a vendor's wire format): write "
                f"{example}, or Message(role=..., blocks=(TextBlock(text=...), ...))"
            )
        return data

    @classmethod
    def text(cls, role: Role | str, text: str) -> Message:
        """A single-block text message."""
        return cls(role=Role(role), blocks=(TextBlock(text=text),))

    def text_content(self) -> str:
        """The text blocks joined: the human-readable answer without tool calls."""
        return "".join(b.text for b in self.blocks if isinstance(b, TextBlock))

    def tool_uses(self) -> list[ToolUse]:
        """The tool calls requested in this message, in order."""
        return [b for b in self.blocks if isinstance(b, ToolUse)]


class Tool(_Value):
    """A capability the model may call: the declaration only; running it is the caller's job."""

    name: Text
    description: Text = ""
    input_schema: JSONObject = Field(default_factory=lambda: {"type": "object"})


ToolChoiceMode: TypeAlias = Literal["auto", "required", "none", "tool"]
_MODES = ("auto", "required", "none")  # the modes a bare string may name
_LISTED = 20  # the most tool names an error lists


def _shown(name: str) -> str:
    """A tool name as an error quotes it: at most 64 characters (names are input)."""
    return repr(name) if len(name) <= 64 else f"{name[:64]!r} [... {len(name):,} characters]"


class ToolChoice(_Value):
    """Which tools the model may call in its reply.

    - ``auto`` (the default): the model decides, as without a choice;
    - ``required``: it calls at least one tool, any of the request's;
    - ``none``: it calls none; the tools stay advertised, so a cached prefix holding them
      stays valid (dropping them from the request would change it);
    - ``tool``: it calls the tool ``name`` (and no other), which must be one of the
      request's tools.

    Where a ``ToolChoice`` is expected a string does: ``"auto"``, ``"required"`` and
    ``"none"`` are those modes, and any other string names a tool (a tool that is itself
    called ``"auto"`` is ``ToolChoice.tool("auto")``). ``required`` and ``tool`` *force* a
    call; the step engine sends them only with a request that answers a prompt, not with
    one that sends tool results (``steps.ToolChoiceScope``), or a model that must call a
    tool at every step would never answer.
    """

    mode: ToolChoiceMode = "auto"
    name: Text | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"mode": data} if data in _MODES else {"mode": "tool", "name": data}
        return data

    @model_validator(mode="after")
    def _name_with_tool_only(self) -> ToolChoice:
        if self.mode != "tool":
            if self.name is not None:
                raise ValueError(f"tool_choice {self.mode!r} takes no tool name (got "
                                 f"{_shown(self.name)}): name a tool with ToolChoice.tool(name)")
            return self
        if not self.name:
            raise ValueError("tool_choice 'tool' needs the name of the tool to call: "
                             "ToolChoice.tool(name)")
        if len(self.name) > MAX_TOOL_NAME_CHARS:
            raise ValueError(
                f"tool_choice names a tool of {len(self.name):,} characters, past the "
                f"{MAX_TOOL_NAME_CHARS} a tool call's name may have: no model could call it")
        return self

    @classmethod
    def tool(cls, name: str) -> ToolChoice:
        """Force a call to the tool ``name`` (whatever the name, "auto" included)."""
        return cls(mode="tool", name=name)

    @property
    def forces(self) -> bool:
        """Does this choice make the model call a tool (``required`` or a named tool)?"""
        return self.mode == "required" or self.mode == "tool"

    def __str__(self) -> str:
        return f"tool {_shown(self.name or '')}" if self.mode == "tool" else repr(self.mode)

    def check(self, tools: Sequence[Tool]) -> None:
        """Raise ``ValueError`` unless a request offering ``tools`` can honour this choice:
        ``required`` needs a tool, and a named tool must be one of them."""
        if not self.forces:
            return
        names = [t.name for t in tools]
        if not names:
            raise ValueError(f"tool_choice {self} forces a tool call, but the request offers "
                             "no tools: offer the tool, or use 'auto' or 'none'")
        if self.mode == "tool" and self.name not in names:
            listed = ", ".join(_shown(n) for n in names[:_LISTED])
            more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
            raise ValueError(
                f"tool_choice names the {self}, which is not one of the request's tools "
                f"({listed}{more}): name one of those, or use 'auto', 'required' or 'none'")

    def honoured_by(self, message: Message) -> str | None:
        """None if a reply ``message`` keeps to this choice, else how it does not (for test
        doubles and local models, which must be checked: the providers keep to it)."""
        called = [u.name for u in message.tool_uses()]
        if self.mode == "none" and called:
            return f"it calls {_shown(called[0])} although tool_choice is 'none'"
        if self.forces and not called:
            return f"it calls no tool although tool_choice {self} forces a call"
        if self.mode == "tool" and (other := next((n for n in called if n != self.name), None)):
            return f"it calls {_shown(other)} although tool_choice is the {self}"
        return None


AUTO = ToolChoice()
"""The default choice: the model decides."""


class CacheHint(_Value):
    """Which parts of a request are stable across turns (advisory, provider-neutral).

    ``prefix`` marks system prompt and tools as one cacheable boundary; ``stable_messages``
    is the count of leading messages that will not change (a marker goes after message
    ``stable_messages - 1``); ``key`` is a routing hint shared by one conversation's turns.
    The zero value caches nothing.
    """

    prefix: bool = False
    stable_messages: int = Field(default=0, ge=0)
    key: Text = ""


class Sampling(_Value):
    """Pinned decoding parameters, so a local generation can be recorded and replayed."""

    seed: int | None = None
    temperature: float = 0.0
    top_p: float = 0.0

    def deterministic(self) -> bool:
        """True only for greedy decoding (temperature zero): reproducible on the same weights."""
        return self.normalized().temperature == 0.0

    def normalized(self) -> Sampling:
        """A copy with every field forced into range: temperature >= 0, top_p in [0, 1]."""
        t = self.temperature if math.isfinite(self.temperature) else 0.0
        p = self.top_p if math.isfinite(self.top_p) else 0.0
        return Sampling(seed=self.seed, temperature=max(t, 0.0), top_p=min(max(p, 0.0), 1.0))


class Request(_Value):
    """One call to a model: instructions, the conversation so far, tools and limits.

    Its history never reuses a tool call's id: a duplicate is refused (``ValueError``, as a
    pydantic ``ValidationError``), as no provider could pair each call with its result.
    ``tool_choice`` (a ``ToolChoice``, or a string as it takes one) is checked against
    ``tools`` the same way: ``required`` without tools, or a tool name the request does not
    offer, is refused."""

    system: Text = ""
    messages: tuple[Message, ...] = ()
    tools: tuple[Tool, ...] = ()
    max_tokens: int | None = Field(default=None, gt=0)
    cache: CacheHint = CacheHint()
    sampling: Sampling | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    tool_choice: ToolChoice = AUTO

    @model_validator(mode="after")
    def _tool_choice_offered(self) -> Request:
        if self.tool_choice.mode != "auto":  # the common case: nothing to check
            self.tool_choice.check(self.tools)
        return self

    @model_validator(mode="after")
    def _call_ids_unique(self) -> Request:
        ids = [b.id for m in self.messages for b in m.blocks if type(b) is ToolUse]
        if len(ids) == len(set(ids)):  # the common case, without a call per message
            return self
        from .history import repeated_call_ids  # history imports this module

        if repeated := repeated_call_ids(self.messages):
            raise ValueError(
                f"tool call id {repeated[0][:200]!r} is used by more than one tool call in the "
                "history: every call needs an id of its own, which pairs it with its result "
                "(give each call a fresh one: runtime.llm.history.fresh_call_id())"
            )
        return self


_M = TypeVar("_M", bound=BaseModel)
_set = object.__setattr__


def made(cls: type[_M], **fields: Any) -> _M:
    """An instance of ``cls`` from values that are already what its fields hold (instances
    the port validated itself), every field given, without validating them again: what
    ``model_construct`` does, at a fifth of its cost (and a third of validating). For the
    few values the step engine makes at every step from parts it made: a reply's message
    and response, a step's results. Anything from outside goes through the constructor."""
    m = object.__new__(cls)
    _set(m, "__dict__", fields)
    _set(m, "__pydantic_fields_set__", set(fields))
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m


class Usage(_Value):
    """Token cost of a call, normalised across providers.

    ``input_tokens`` is the total input processed, *including* cache reads;
    ``cache_read_tokens`` is the cached subset; ``cache_write_tokens`` is additional.
    ``reasoning_tokens`` is the part of ``output_tokens`` spent thinking, where the
    provider says (OpenAI's ``reasoning_tokens``, Gemini's ``thoughtsTokenCount``); 0 where
    it does not (Anthropic bills thinking as output without a count of its own).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        # once per step, every turn: adding nothing (a call that reported no usage) makes
        # nothing new; a sum is made by the validating constructor (Rust), which costs two
        # thirds of model_construct's Python
        if not (other.input_tokens or other.output_tokens or other.cache_read_tokens
                or other.cache_write_tokens or other.reasoning_tokens):
            return self
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


class Response(_Value):
    """One model turn: the assistant message, why it stopped, and what it cost."""

    message: Message
    stop_reason: StopReason
    usage: Usage = Usage()
    model: str = ""
