"""The local model in the bundled todo agent: does it call the tool a user asks for, answer a
plain question in words, and never loop? (issue 15; ``docs/local-model.md`` has the table)

    python bench/local_model.py                      # the default weights, every method
    python bench/local_model.py --methods choose     # one method
    python bench/local_model.py --model gemma3-270m=/path/gemma-3-270m-q4_k_m.gguf  # instead

Each (model, method) runs in a subprocess of its own (so its RSS is its own): a fresh
``Runtime`` on the memory store, and for every case of ``bench/local_cases.py`` a new user
whose list is ``LIST``, one message sent to ``patterns.todo_agent`` and the turn settled. A
tool case is right when the turn's first call is the expected tool with an expected title
(and ``done`` flag); a question is right when the turn calls no tool. A reply is
degenerate when a run of words comes round three times in a row, or a line three times.
First-token time is from the model call to its first event; tokens/s is output tokens over
the time after that first event; RSS is the subprocess's peak.

Methods: ``grammar`` is the model before issue 15 (tools described in the prompt, one
grammar admitting text or a call, no repetition penalties); ``grammar+penalties`` adds the
penalties; ``choose`` is the default (the calibrated decision, then the answer or the call,
penalties on text); ``choose-no-penalties`` and ``choose-greedy`` (temperature 0) vary it.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ '<start_of_turn>user\\n' + m['content'] + '\\n\\n' }}"
    "{% set ns_sys = true %}{% elif m['role'] == 'user' %}"
    "{% if not (loop.index0 == 1 and messages[0]['role'] == 'system') %}"
    "{{ '<start_of_turn>user\\n' }}{% endif %}{{ m['content'] + '<end_of_turn>\\n' }}"
    "{% else %}{{ '<start_of_turn>model\\n' + m['content'] + '<end_of_turn>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
"""Gemma's turn format, for a Gemma GGUF that ships no chat template (the 270M base)."""

METHODS: dict[str, dict[str, Any]] = {
    "grammar": {"tool_decision": "grammar", "penalties": None},
    "grammar+penalties": {"tool_decision": "grammar"},
    "choose": {},
    "choose-no-penalties": {"penalties": None},
    "choose-greedy": {"greedy": True},
}


def degenerate(text: str) -> bool:
    """Does a run of words (1 to 12 of them) come round three times in a row, or a line?"""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if any(lines[i] == lines[i + 1] == lines[i + 2] for i in range(len(lines) - 2)):
        return True
    words = re.findall(r"\w+|[^\w\s]", text.lower())
    for n in range(1, 13):
        for i in range(len(words) - 3 * n + 1):
            a = words[i:i + n]
            if a == words[i + n:i + 2 * n] == words[i + 2 * n:i + 3 * n] and (
                    n > 1 or (a[0].isalpha() and len(a[0]) > 2)):
                return True
    return False


def _normal(title: str) -> str:
    return title.strip().strip("'\"").rstrip(".").strip().casefold()


# -- one (model, method), in its own process ------------------------------------------------


async def _one(path: str | None, method: str, template: str | None) -> dict[str, Any]:
    from bench.local_cases import ADDS, CHANGES, LIST, QUESTIONS
    from patterns.todo_agent import todo_agent
    from runtime import Runtime
    from runtime.llm import LocalModel, Sampling
    from runtime.llm.events import TextDelta, UsageUpdate

    options = dict(METHODS[method])
    greedy = options.pop("greedy", False)
    inner = LocalModel(path, sampling=Sampling(temperature=0) if greedy else None,
                       chat_template=template, **options)
    calls: list[dict[str, float]] = []

    class Timed:  # the model, with the time to its first event and its decoding rate
        name, provider = inner.name, inner.provider

        async def generate(self, request: Any) -> Any:
            raise NotImplementedError  # the dialog streams

        async def stream(self, request: Any) -> AsyncIterator[Any]:
            start = time.perf_counter()
            first = None
            tokens = 0
            async for event in inner.stream(request):
                if first is None and (isinstance(event, TextDelta) or
                                      type(event).__name__.startswith("ToolCall")):
                    first = time.perf_counter()
                if isinstance(event, UsageUpdate):
                    tokens = event.usage.output_tokens
                yield event
            end = time.perf_counter()
            first = first or end
            calls.append({"first": first - start, "tokens": tokens, "decode": end - first})

    cases = [("add", c) for c in ADDS] + [("change", c) for c in CHANGES] + \
        [("question", q) for q in QUESTIONS]
    out: list[dict[str, Any]] = []
    async with Runtime(model=Timed()) as rt:
        for n, (kind, case) in enumerate(cases):
            inst = rt.run(todo_agent, user=f"u{n}", session="s")
            inst.result.key("items").set([dict(x) for x in LIST])
            await rt.settled()
            text = case if kind == "question" else case.text
            await inst.send("send", text)
            await rt.settled()
            messages = inst.result.key("messages").get()
            uses = [b for m in messages if m["role"] == "assistant" for b in m["blocks"]
                    if b.get("kind") == "tool_use"]
            replies = [b["text"] for m in messages if m["role"] == "assistant"
                       for b in m["blocks"] if b.get("kind") == "text"]
            first = uses[0] if uses else None
            if kind == "question":
                right = first is None
            else:
                args = (first or {}).get("input", {})
                right = (first is not None and first["name"] == case.tool
                         and _normal(str(args.get("title", ""))) in
                         {_normal(t) for t in case.titles}
                         and (case.done is None or args.get("done", True) == case.done))
            reply = "\n".join(replies)
            out.append({"kind": kind, "text": text, "right": right,
                        "call": first and {"name": first["name"], "input": first["input"]},
                        "reply": reply[:300], "degenerate": degenerate(reply)})
    firsts = [c["first"] for c in calls]
    rates = [c["tokens"] / c["decode"] for c in calls if c["tokens"] > 4 and c["decode"] > 0]
    return {"cases": out, "first_token_s": statistics.median(firsts),
            "tokens_per_s": statistics.median(rates) if rates else 0.0,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# -- the table ------------------------------------------------------------------------------


def _row(model: str, method: str, r: dict[str, Any]) -> str:
    def count(kind: str, key: str = "right", limit: int | None = None) -> int:
        xs = [c for c in r["cases"] if c["kind"] == kind][:limit]
        return sum(bool(c[key]) for c in xs)

    return (f"| {model} | {method} | {count('add')}/10 | {count('change')}/10 | "
            f"{count('question', limit=10)}/10 | {count('question')}/20 | "
            f"{count('question', 'degenerate')}/20 | {r['tokens_per_s']:.0f} | "
            f"{r['rss_mb']:.0f} | {r['first_token_s']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                        help="a GGUF to measure instead of the default weights (repeatable)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated, of: {', '.join(METHODS)}")
    parser.add_argument("--json", metavar="FILE", help="also write every case's outcome here")
    parser.add_argument("--one", nargs=3, metavar=("PATH", "METHOD", "TEMPLATE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        import anyio

        path, method, template = args.one
        result = anyio.run(_one, path or None, method,
                           GEMMA_TEMPLATE if template == "gemma" else None)
        print(json.dumps(result))
        return
    models = [] if args.model else [("SmolLM2-135M", "", "")]
    for spec in args.model:
        name, _, path = spec.partition("=")
        models.append((name, path, "gemma" if "gemma" in name.lower() else ""))
    print("| model | method | add X (of 10) | remove/done (of 10) | questions 1-10 without "
          "a tool | all 20 | degenerate (of 20) | tokens/s | RSS MB | first token s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    everything: dict[str, Any] = {}
    for name, path, template in models:
        for method in args.methods.split(","):
            done = subprocess.run([sys.executable, __file__, "--one", path, method, template],
                                  capture_output=True, text=True, check=False)
            if done.returncode:
                print(f"| {name} | {method} | failed: {done.stderr.strip()[-300:]} |")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            everything[f"{name} {method}"] = result
            print(_row(name, method, result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
