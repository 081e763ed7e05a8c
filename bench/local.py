"""The embedded model's overhead: ``LocalModel`` against llama-cpp-python's own high-level API.

    python bench/local.py [--blocks 5] [--tokens 64]

Both sides run the same loaded ``Llama`` (the process's one model), the same prompt text
(our chat messages through the GGUF chat template), greedy decoding and the same output
budget, so they produce the same tokens, which the script checks. Two cases:

- **text**: no tools, no grammar: ``LocalModel.stream`` vs ``Llama.create_chat_completion(
  stream=True)``;
- **grammar**: tools offered: our reply grammar on both sides (``LlamaGrammar.from_string``
  for theirs), which we apply grammar-last (sample, then check) and they apply to every
  candidate at every step.

Each side evaluates the whole prompt every run (ours: a pinned request; theirs: ``reset()``),
so neither gains from the KV cache. After a warm-up run of each, ``--blocks`` blocks alternate
the two sides; each figure is the median over blocks: time to first token, decode tokens per
second (after the first token), and peak resident memory during the run (sampled every 2 ms;
the model's own memory is in it, shared by both). The ratio is ours / theirs for time to first
token and theirs / ours for throughput, so above 1 means we are slower (target: under 1.10).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.llm import Message, Request, Role, Sampling, TextDelta, Tool, ToolCallStart
from runtime.llm.events import ToolCallDelta, ToolCallEnd
from runtime.llm.providers._grammar import CALL_SUFFIX, call_prefix
from runtime.llm.providers.local import LocalModel, _engine, chat_messages

TOOLS = (
    Tool(name="get_weather", description="Current weather for a city.", input_schema={
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    Tool(name="convert", description="Convert a temperature.", input_schema={
        "type": "object", "properties": {"celsius": {"type": "number"},
                                         "to": {"enum": ["fahrenheit", "kelvin"]}},
        "required": ["celsius", "to"]}),
)
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Run:
    ttft: float  # seconds to the first streamed output (text, or a call once named)
    tokens_per_s: float  # after the first token
    peak_rss: int  # bytes
    text: str
    first_token: float = 0.0  # seconds to the first token sampled (see ``timed``)


class PeakRSS:
    """The process's resident memory, sampled in a thread while a run lasts."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        with open("/proc/self/statm") as f:
            while not self._stop.is_set():
                f.seek(0)
                self.peak = max(self.peak, int(f.read().split()[1]) * PAGE)
                time.sleep(0.002)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def ours(portal: BlockingPortal, model: LocalModel, request: Request) -> Run:
    """One streamed request, on the portal's event loop (one loop and one worker pool for the
    whole run, as in an application)."""

    async def go() -> Run:
        start = time.perf_counter()
        first = None
        parts: list[str] = []
        with PeakRSS() as rss:
            async for event in model.stream(request):  # the raw reply, rebuilt from events
                if first is None and isinstance(event, TextDelta | ToolCallStart):
                    first = time.perf_counter()
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                elif isinstance(event, ToolCallStart):
                    parts.append(call_prefix(event.name))
                elif isinstance(event, ToolCallDelta):
                    parts.append(event.arguments)
                elif isinstance(event, ToolCallEnd):
                    parts.append(CALL_SUFFIX)
        assert first is not None
        return Run(first - start, 0.0, rss.peak, "".join(parts))

    return portal.call(go)


def theirs(model: LocalModel, request: Request, grammar: str | None) -> Run:
    from llama_cpp import LlamaGrammar

    llm = _engine(model._key).llm
    llm.reset()  # evaluate the whole prompt, as our pinned request does
    start = time.perf_counter()
    first = None
    parts: list[str] = []
    with PeakRSS() as rss:
        for chunk in llm.create_chat_completion(
                messages=chat_messages(request), max_tokens=request.max_tokens, temperature=0.0,
                stream=True, grammar=LlamaGrammar.from_string(grammar) if grammar else None):
            text = chunk["choices"][0]["delta"].get("content")
            if text:
                if first is None:
                    first = time.perf_counter()
                parts.append(text)
    assert first is not None
    return Run(first - start, 0.0, rss.peak, "".join(parts))


def timed(run: Callable[[], Run], tokens: Callable[[str], int], llm: Any) -> Run:
    """Run one side, timing the first token the same way on both: each side evaluates the
    prompt with ``Llama.eval``, then each sampled token, so the second ``eval`` call starts
    when the first token has been sampled (whatever either side streams, and when)."""
    evals: list[float] = []
    real = llm.eval

    def eval_(batch: Any) -> None:
        evals.append(time.perf_counter())
        real(batch)

    llm.eval = eval_
    try:
        start = time.perf_counter()
        result = run()
        end = time.perf_counter()
    finally:
        del llm.eval  # the instance attribute goes; the method shows again
    result.first_token = evals[1] - start if len(evals) > 1 else end - start
    n = tokens(result.text)
    decode = end - start - result.first_token
    result.tokens_per_s = (n - 1) / decode if n > 1 and decode > 0 else float("nan")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    # Overhead only: the one grammar llama-cpp-python can be given too, no penalties (its
    # default); bench/local_model.py measures the decision and the penalties.
    model = LocalModel(tool_decision="grammar", penalties=None)
    engine = _engine(model._key)
    llm = engine.llm

    def count(text: str) -> int:
        return len(llm.tokenize(text.encode(), add_bos=False, special=False))

    cases = {
        "text": (Request(messages=(Message.text(
            Role.USER, "Write a short story about a lighthouse keeper."),),
            max_tokens=args.tokens, sampling=Sampling(temperature=0.0)), None),
        "grammar": (Request(system="Use a tool when it helps.", tools=TOOLS, messages=(
            Message.text(Role.USER, "Weather in Oslo, please?"),),
            max_tokens=args.tokens, sampling=Sampling(temperature=0.0)),
            model.grammar(TOOLS).text),
    }
    print(f"model {model.name} ({model.path.stat().st_size / 1e6:.0f} MB), context "
          f"{engine.n_ctx}, threads {llm.n_threads}, {os.cpu_count()} processors; "
          f"{args.blocks} blocks after warm-up, medians")
    print(f"{'case':8} {'side':26} {'TTFT ms':>8} {'1st out ms':>10} {'tok/s':>8} "
          f"{'peak RSS MB':>12}")
    with start_blocking_portal() as portal:
        for case, (request, grammar) in cases.items():
            report(case, request, grammar, portal, model, count, args.blocks)


def report(case: str, request: Request, grammar: str | None, portal: BlockingPortal,
           model: LocalModel, count: Callable[[str], int], blocks: int) -> None:
    """One case: a warm-up run of each side, then alternating blocks; medians printed."""
    llm = _engine(model._key).llm
    ours_run = lambda r=request: ours(portal, model, r)
    theirs_run = lambda r=request, g=grammar: theirs(model, r, g)
    a, b = timed(ours_run, count, llm), timed(theirs_run, count, llm)  # warm-up
    same = a.text == b.text
    runs: dict[str, list[Run]] = {"ours": [], "theirs": []}
    for _ in range(blocks):
        runs["ours"].append(timed(ours_run, count, llm))
        runs["theirs"].append(timed(theirs_run, count, llm))
    med = {side: (statistics.median(r.first_token for r in rs) * 1000,
                  statistics.median(r.ttft for r in rs) * 1000,
                  statistics.median(r.tokens_per_s for r in rs),
                  statistics.median(r.peak_rss for r in rs) / 1e6)
           for side, rs in runs.items()}
    for side, label in (("ours", "LocalModel.stream"),
                        ("theirs", "create_chat_completion")):
        ttft, out, tps, rss = med[side]
        print(f"{case:8} {label:26} {ttft:8.1f} {out:10.1f} {tps:8.1f} {rss:12.1f}")
    (ot, oo, otp, _), (tt, to, ttp, _) = med["ours"], med["theirs"]
    print(f"{case:8} {'ratio (>1: we are slower)':26} {ot / tt:8.3f} {oo / to:10.3f} "
          f"{ttp / otp:8.3f}   output tokens {count(a.text)}, same text on both sides: {same}")


if __name__ == "__main__":
    main()
