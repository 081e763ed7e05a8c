"""What a dialog accepts into its history, from the user and from the model.

- **The user** (``add_message``) sends a string, or a user message holding text and
  supported images only (``user_message``). Tool calls, tool results and provider blocks
  are the dialog's to write: a user message carrying one would break the history (a result
  no call asked for) or splice provider content into a request (an opaque block's raw JSON
  goes to the provider verbatim), so each is refused with an error saying what to send.
- **The model's** JSON (a call's input) is stored *inert* (``inert``, or ``own_json`` of
  the cell core for a whole message): a link-shaped object in it is kept as its JSON text,
  so the history never holds a live link the model made up (it would alias other
  documents on read).
- **Stored history** is read back through ``TypedHistory``: text that cannot be encoded
  (a lone surrogate, in data stored before the boundary refused it) is replaced, so one bad
  character never makes every later turn fail.
"""

from __future__ import annotations

import json
from typing import Any

from .._text import describe_surrogate, has_surrogate, scrub
from ..cells import is_link, same
from ..errors import PatternError
from ..llm import ImageBlock, Message, Role, TextBlock, with_unique_call_ids
from ..llm.safety import SUPPORTED_IMAGE_MEDIA_TYPES, supported_image_media_type

__all__ = ["MAX_MESSAGE_CHARS", "TypedHistory", "inert", "user_message"]

MAX_MESSAGE_CHARS = 200_000  # characters of text in one user message
MAX_IMAGES = 20  # images in one user message
MAX_BLOCKS = 100  # blocks in one user message
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # one image (what Anthropic takes)
MAX_IMAGES_BYTES = 20 * 1024 * 1024  # all the images of one message

# what an image's bytes start with, by media type: bytes that are not what they claim to be
# would be refused by the provider at every later request of the history
_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}

_SHAPE = ("add_message takes a string (the user's text) or a user message "
          "{'role': 'user', 'blocks': [{'kind': 'text', 'text': '...'}]} whose blocks are text "
          f"and images ({', '.join(sorted(SUPPORTED_IMAGE_MEDIA_TYPES))})")


def user_message(event: Any) -> Message:
    """The user's message from an ``add_message`` event, or a ``PatternError`` saying what
    was wrong and what to send instead."""
    if isinstance(event, str):
        if not event.strip():
            raise PatternError("add_message got an empty string; send the user's text")
        _check_text(event, "add_message's text")
        return Message(role=Role.USER, blocks=(TextBlock(text=event),))
    if not isinstance(event, dict):
        raise PatternError(f"{_SHAPE}; got {type(event).__name__} {_short(event)}")
    if event.get("role") != "user":
        raise PatternError(f"{_SHAPE}; got a message whose role is {_short(event.get('role'))} "
                           "(the dialog writes the assistant's messages itself)")
    blocks = event.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        raise PatternError(f"{_SHAPE}; got a message with no blocks")
    if len(blocks) > MAX_BLOCKS:
        raise PatternError(f"add_message got {len(blocks):,} blocks; send at most {MAX_BLOCKS} "
                           "(join the text into one block)")
    images = 0
    for i, block in enumerate(blocks):
        kind = block.get("kind") if isinstance(block, dict) else None
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                _check_text(text, f"add_message's block {i}")
        elif kind == "image":
            images += 1
            media = block.get("media_type")
            if not isinstance(media, str) or not supported_image_media_type(media):
                raise PatternError(
                    f"add_message's block {i} is an image of type {_short(media)}, which the "
                    f"providers do not take; send one of "
                    f"{', '.join(sorted(SUPPORTED_IMAGE_MEDIA_TYPES))}")
        else:
            named = kind if isinstance(kind, str) and kind.isidentifier() and len(kind) < 40 \
                else _short(kind)
            raise PatternError(
                f"add_message's block {i} is a {named} block; {_SHAPE}. Tool calls, "
                "tool results and provider blocks are written by the dialog, never sent")
    if images > MAX_IMAGES:
        raise PatternError(f"add_message got {images} images; send at most {MAX_IMAGES}")
    try:
        message = Message.model_validate(event)
    except ValueError as e:
        raise PatternError(f"add_message: {_SHAPE}; {_short(str(e), 300)}") from None
    _check_images(message)
    text = sum(len(b.text) for b in message.blocks if isinstance(b, TextBlock))
    if text > MAX_MESSAGE_CHARS:
        raise PatternError(f"add_message got {text:,} characters of text; send at most "
                           f"{MAX_MESSAGE_CHARS:,}")
    if not any((isinstance(b, TextBlock) and b.text.strip()) or isinstance(b, ImageBlock)
               for b in message.blocks):
        raise PatternError("add_message got a message with only empty text; send the "
                           "user's text")
    return message


def _check_images(message: Message) -> None:
    """Each image holds bytes of the type it claims, within the size limits."""
    total = 0
    for i, b in enumerate(message.blocks):
        if not isinstance(b, ImageBlock):
            continue
        media = b.media_type.strip().lower()
        size = len(b.data)
        total += size
        if size == 0:
            raise PatternError(f"add_message's block {i} is an image with no data")
        if size > MAX_IMAGE_BYTES:
            raise PatternError(f"add_message's block {i} is an image of {size:,} bytes; send "
                               f"at most {MAX_IMAGE_BYTES:,} (scale it down)")
        magic = _MAGIC.get(media, ())
        if not b.data.startswith(magic) or (media == "image/webp" and b.data[8:12] != b"WEBP"):
            raise PatternError(f"add_message's block {i} says {media}, but its bytes are not "
                               f"a {media.split('/')[1].upper()} image; send the image's own "
                               "bytes with its media type")
    if total > MAX_IMAGES_BYTES:
        raise PatternError(f"add_message got {total:,} bytes of images; send at most "
                           f"{MAX_IMAGES_BYTES:,}")


def _check_text(text: str, where: str) -> None:
    if len(text) > MAX_MESSAGE_CHARS:
        raise PatternError(f"{where} is {len(text):,} characters; send at most "
                           f"{MAX_MESSAGE_CHARS:,}")
    if has_surrogate(text):
        raise PatternError(describe_surrogate(text, where))


KEEP_FROM = 16  # a history this long is kept typed between turns (shorter: read again)


class TypedHistory:
    """The stored history as messages, remembered between turns: a turn validates only the
    messages that are not, by value (JSON's strict equality), the ones it validated last
    time. Anyone may rewrite the history between turns; whatever changed is read again.
    A short history (under ``KEEP_FROM`` messages) costs little to read again and is not
    kept: an idle session holds no second copy of it."""

    __slots__ = ("_raw", "_typed")

    def __init__(self) -> None:
        self._raw: list[Any] = []
        self._typed: list[Message] = []

    def load_cell(self, messages: Any) -> tuple[Message, ...]:
        """The history a ``messages`` cell holds, as messages: the whole list is compared
        with what was validated last time without copying it (``Cell.raw(copy=False)``),
        and only messages that differ are read (links followed) and validated. A list kept
        short of ``KEEP_FROM`` is read whole, as ``load`` reads it."""
        live = messages.raw(copy=False)
        old = self._raw
        if not isinstance(live, list) or len(live) < KEEP_FROM or not old:
            return self.load(messages.get())
        n, limit = 0, min(len(old), len(live))
        while n < limit and same(old[n], live[n]):
            n += 1
        # the rest, read as get() reads it (links followed, a copy of each)
        return self.load(old[:n] + [messages.key(i).get() for i in range(n, len(live))])

    def load(self, raw: Any) -> tuple[Message, ...]:
        """``raw`` (the messages cell's value, a copy this takes over) as messages."""
        if not isinstance(raw, list):
            raise PatternError(f"the dialog's messages cell holds {type(raw).__name__}, not a "
                               "list of messages")
        old, n = self._raw, 0
        limit = min(len(old), len(raw))
        while n < limit and same(old[n], raw[n]):
            n += 1
        try:
            typed = self._typed[:n] + [_message(m) for m in raw[n:]]
        except ValueError as e:
            raise PatternError(f"the dialog's messages cell holds something that is not a "
                               f"message: {_short(str(e), 300)}") from None
        if len(raw) >= KEEP_FROM:
            self._raw, self._typed = raw, typed
        elif self._raw:
            self._raw, self._typed = [], []
        # a call reusing an earlier call's id (stored before servers' missing ids were
        # minted unique) gets a fresh one, and so do its results: Request refuses a
        # repeated id
        return with_unique_call_ids(typed)


def _message(raw: Any) -> Message:
    """One stored message; only one the vocabulary refuses is read again repaired (the
    vocabulary refuses lone surrogates, so valid text costs no second walk)."""
    try:
        return Message.model_validate(raw)
    except ValueError:
        return Message.model_validate(scrub(raw))


def inert(value: Any) -> Any:
    """``value`` with each link-shaped object in it stored as its JSON text. The call
    itself ran with what the model sent."""
    if isinstance(value, dict):
        if is_link(value):
            return json.dumps(value, sort_keys=True)
        out = {k: inert(v) for k, v in value.items()}
        # link-shaped only now ({"@link": <a link>}: the inner one became its text)
        return json.dumps(out, sort_keys=True) if is_link(out) else out
    if isinstance(value, list):
        return [inert(v) for v in value]
    return value


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    text = text if isinstance(text, str) else str(text)
    return repr(text[:limit] + ("..." if len(text) > limit else ""))

