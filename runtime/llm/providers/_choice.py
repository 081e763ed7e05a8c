"""The local model's decision, made before it decodes: answer in words, or call which tool.

A tiny model under a grammar that admits both chooses with its first token, and that token
is biased: SmolLM2-135M called a tool for 0 of 18 requests with the tools only described,
and for every plain question once a grammar offered nothing but calls (issue 15). So the
decision is taken apart from the decoding, from the model's own probabilities, in two looks
(``docs/local-model.md`` has the measurements behind each):

1. **Answer or act: the channel.** How likely is the user's message given each intent?
   ``log P(message | "What the user wants: <intent>")`` for "reply" and for each tool (its
   name in words and its description). The message is the long part and carries the signal;
   the intents are short. If "reply" explains the message best, the model answers in words.
2. **Which tool: channel plus calibrated choice.** Otherwise each tool scores its channel
   term plus the model's own choice of its name after ``Action:`` in the real prompt (system
   prompt, context, the message), corrected for the model's bias: minus the same score for
   content-free messages ("N/A", "", "ok"), the contextual calibration of Zhao et al. (2021,
   "Calibrate Before Use"). Then the arguments are decoded under that tool's schema.

The module knows no llama.cpp: it gets a scoring function (``Score``: the log-probability of
each continuation after a prefix) and a renderer for the model's chat template.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..types import Tool

__all__ = ["NULL_MESSAGES", "REPLY_INTENT", "Chooser", "Decision", "Score", "intent_of"]

Score = Callable[[str, Sequence[str]], list[float]]
"""``score(prefix, continuations)``: ``log P(continuation | prefix)`` for each; the prefix is
prompt text (special tokens allowed), each continuation plain text."""
Render = Callable[[str, str], str]
"""``render(system, user)``: the chat template's prompt for one user message, up to where the
assistant's reply starts."""

REPLY = "reply"
REPLY_INTENT = "reply. Ask a question or chat, without changing anything."
CHANNEL = "A message to an assistant.{role} What the user wants: {intent}\nThe user's message:"
ROLE_CHARS = 200  # of the system prompt's first sentence, the assistant's role in the channel
NULL_MESSAGES = ("N/A", "", "ok")
"""Content-free messages: the model's scores for them are its bias, subtracted."""
DESCRIPTION_CHARS = 200  # of a tool's description, in its intent
MAX_MESSAGE_CHARS = 2_000  # of the user's message, scored (its head carries the request)
CACHED_PRIORS = 32  # (system prompt, tools) pairs whose bias is kept


@dataclass(frozen=True)
class Decision:
    """What the model will do: ``tool`` is None for an answer in words. ``scores`` are the
    final scores of the options compared (for logs and the benchmark)."""

    tool: str | None
    scores: dict[str, float]


def _words(name: str) -> str:
    """``addItem`` -> "add item": a name as the model reads words."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|[_\-.]+", " ", name).strip().lower()


def intent_of(tool: Tool) -> str:
    """What calling ``tool`` means, in the words the channel conditions on."""
    description = " ".join(tool.description.split())[:DESCRIPTION_CHARS]
    return f"{_words(tool.name)}. {description}" if description else _words(tool.name)


def _first_sentence(system: str) -> str:
    """The system prompt's first sentence (" You keep the user's todo list..."): who the
    assistant is, which makes some intents likelier than others."""
    text = " ".join(system.split())
    if not text:
        return ""
    end = re.search(r"[.!?](\s|$)", text)
    return " " + (text[: end.end()].strip() if end else text)[:ROLE_CHARS]


class Chooser:
    """Decides between answering and each tool for one model (its bias cached per prompt)."""

    def __init__(self, render: Render) -> None:
        self._render = render
        self._priors: OrderedDict[str, list[float]] = OrderedDict()

    def decide(self, score: Score, system: str, message: str, tools: Sequence[Tool], *,
               answer: bool = True, pinned: bool = False) -> Decision:
        """Answer (``tool=None``) or which of ``tools`` to call for the user's ``message``;
        ``answer=False`` when a call is required. ``pinned``: the bias is the one measured
        the same way (a pinned request's decision depends on nothing before it). Blocking:
        run it in a worker thread."""
        message = message[:MAX_MESSAGE_CHARS]
        names = [t.name for t in tools]
        role = _first_sentence(system)
        channel = self._channel(score, role, message, [intent_of(t) for t in tools])
        if answer:
            reply = self._channel(score, role, message, [REPLY_INTENT])[0]
            if not tools or reply >= max(channel):
                return Decision(None, {REPLY: reply, **dict(zip(names, channel, strict=True))})
        if len(tools) == 1:
            return Decision(names[0], {names[0]: channel[0]})
        choice = self._action(score, system, message, tools)
        prior = self._prior(score, system, tools, pinned)
        total = [c + a - p for c, a, p in zip(channel, choice, prior, strict=True)]
        best = max(range(len(names)), key=total.__getitem__)
        return Decision(names[best], dict(zip(names, total, strict=True)))

    def _channel(self, score: Score, role: str, message: str,
                 intents: Sequence[str]) -> list[float]:
        quoted = f' "{message}"'
        return [score(CHANNEL.format(role=role, intent=i), [quoted])[0] for i in intents]

    def _action(self, score: Score, system: str, message: str,
                tools: Sequence[Tool]) -> list[float]:
        lines = [f"- {REPLY}: answer in words (questions, chat)"]
        lines += [f"- {t.name}: {' '.join(t.description.split())[:DESCRIPTION_CHARS]}"
                  if t.description else f"- {t.name}" for t in tools]
        actions = ("Actions:\n" + "\n".join(lines) + "\nStart your reply with the action, "
                   f"like 'Action: {REPLY}' or 'Action: {tools[0].name}'.")
        prompt = f"{system}\n\n{actions}" if system else actions
        return score(self._render(prompt, message) + "Action:", [f" {t.name}" for t in tools])

    def _prior(self, score: Score, system: str, tools: Sequence[Tool],
               pinned: bool) -> list[float]:
        # keyed by a digest: a system prompt can be large, and 32 of them are kept
        key = hashlib.blake2b("\x00".join([str(pinned), system,
                                           *(f"{t.name}\x01{t.description}"
                                                    for t in tools)]).encode(),
                              digest_size=16).hexdigest()
        prior = self._priors.get(key)
        if prior is None:
            runs = [self._action(score, system, m, tools) for m in NULL_MESSAGES]
            prior = [sum(col) / len(runs) for col in zip(*runs, strict=True)]
            self._priors[key] = prior
            while len(self._priors) > CACHED_PRIORS:
                self._priors.popitem(last=False)
        else:
            self._priors.move_to_end(key)
        return prior


# -- a call's string values, chosen the same way ----------------------------------------------

MAX_SPAN_WORDS = 8
MAX_CANDIDATES = 160
MAX_VALUE_CHARS = 80
_QUOTED = re.compile(r'"((?:[^"\\]|\\.){0,80})"')  # a JSON string
_EDGES = " \t\n'\"`.,;:!?()[]{}«»“”‘’"


_FUNCTION_WORDS = frozenset(
    "the and for you your can not are was but all any has have its off put too now our "
    "from with this that what who how why when did does please".split())


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w{3,}", text.casefold()) if w not in _FUNCTION_WORDS}


def candidates(message: str, system: str) -> list[str]:
    """The values a string argument may take, each once: the short JSON strings the system
    prompt shows that share a word with the message (the context's values: "I called mum"
    refers to "call mum" on a list), then every run of up to ``MAX_SPAN_WORDS`` words of the
    message (trimmed of quotes and punctuation), longest first, ``MAX_CANDIDATES`` in all.
    Only values the grammar can pin exactly are offered (``pinnable``)."""
    words = message[:MAX_MESSAGE_CHARS].split()
    seen: dict[str, None] = {}
    said = _content_words(message)
    for match in _QUOTED.finditer(system):
        value = match.group(1)
        if system[match.end():match.end() + 16].lstrip().startswith(":"):
            continue  # a key, not a value
        if (pinnable(value) and value.strip(_EDGES) == value
                and said & _content_words(value)):
            seen.setdefault(value, None)
    for n in range(min(MAX_SPAN_WORDS, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            span = " ".join(words[i:i + n]).strip(_EDGES)
            if span and len(span) <= MAX_VALUE_CHARS and pinnable(span):
                seen.setdefault(span, None)
    return list(seen)[:MAX_CANDIDATES]


def pinnable(value: str) -> bool:
    """Can llama-cpp-python's converter write ``value`` as a grammar literal exactly? It
    escapes neither backslashes nor characters past the BMP, so such a value (and a quote
    or a control character) is decoded under the schema instead of pinned."""
    return all(" " <= ch <= "\uffff" and ch not in '"\\' and not 0xD800 <= ord(ch) <= 0xDFFF
               for ch in value)


def choose_value(score: Score, prefix: str, options: Sequence[str]) -> str:
    """The option the model finds likeliest after ``prefix`` (which ends inside an opening
    JSON quote), with its closing quote (what says the value is complete), per word: summed
    log-probabilities favour the shortest runs ("kitchen" for "clean the kitchen")."""
    scores = score(prefix, [f'{json_text(o)}"' for o in options])
    per_word = [x / (len(o.split()) + 1) for x, o in zip(scores, options, strict=True)]
    return options[max(range(len(options)), key=per_word.__getitem__)]


def json_text(value: str) -> str:
    """``value`` as it appears between the quotes of a JSON string."""
    import json

    return json.dumps(value, ensure_ascii=False)[1:-1]
