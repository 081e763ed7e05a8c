"""The conversation object's overhead per step of ``loop()``, beside pydantic-ai's agent loop.

    python bench/conversation.py            # 7 timed blocks of ~0.5 s per case
    python bench/conversation.py --quick    # a smoke run

One run: ``await base.with_prompt("add items").loop()`` against ``ScriptedModel`` (it answers
at once): 5 tool calls to ``add_item`` (one per model step; a method of a bound Python object
that appends the title to a list and answers ``added <title>``), then a final text: 6 model
steps. One tool, no system prompt (``without_default_system_prompt``), as the peer. Between
runs, untimed, the script is refilled and the list emptied, so every run is the same run.

The peer: pydantic-ai's agent loop driven as /work/shared/anchors/pydantic_ai_loop.py drives
it (``Agent(FunctionModel(script))``, ``@agent.tool_plain add_item``, ``await
agent.run("add items")``), in this process, its blocks interleaved with ours after a warm-up
of each. Per step = wall time of a run / 6 (the model is instant, so all of it is overhead),
median over the blocks; CPU time beside it. Target: pydantic-ai's per-step time at least 10x
ours. The anchor script itself also runs once, in a subprocess, as a cross-check.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import Span, clock, since  # noqa: E402
from _steps import Case, K, PydanticAI, anchor_line, timed_block, warm_up  # noqa: E402

from runtime import LLM  # noqa: E402
from runtime.llm import Reply, ScriptedModel, call  # noqa: E402

TARGET = 10.0  # pydantic-ai per-step time / ours, at least

class Items:
    """A list the model adds to."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add_item(self, title: str) -> str:
        """Append an item to the list."""
        self.items.append(title)
        return f"added {title}"


def turn_script(k: int) -> list[Any]:
    return [*(Reply(tool_calls=[call("add_item", {"title": f"item {i}"})]) for i in range(k)),
            "done"]


class Ours(Case):
    label = "LLM.loop()"

    def __init__(self) -> None:
        super().__init__()
        self.model = ScriptedModel()
        self.items = Items()
        self.base = (LLM(model=self.model).without_default_system_prompt()
                     .with_tools(self.items).with_prompt("add items"))

    async def run(self, m: int) -> Span:
        wall = cpu = 0.0
        for _ in range(m):
            self.items.items.clear()  # untimed: every run is the same run
            self.model.requests.clear()
            self.model.add(*turn_script(K))
            t = clock()
            done = await self.base.loop()
            w, c = since(t)
            wall, cpu = wall + w, cpu + c
            if done.last_reply != "done" or len(self.items.items) != K \
                    or len(done.messages) != 2 * K + 2:
                raise RuntimeError(f"the run did not go as scripted: {done.transcript}")
        return wall, cpu


async def measure(blocks: int, block_s: float, warm_s: float) -> list[Case]:
    cases: list[Case] = [Ours(), PydanticAI()]
    for case in cases:
        await warm_up(case, warm_s, block_s)
    rng = random.Random(7)
    for _ in range(blocks):
        rng.shuffle(cases)
        for case in cases:
            await timed_block(case, block_s)
    return sorted(cases, key=lambda c: c.label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter blocks")
    args = parser.parse_args()
    blocks, block_s, warm_s = (3, 0.2, 0.3) if args.quick else (7, 0.5, 1.0)
    import pydantic_ai

    try:
        load = ", ".join(f"{x:.1f}" for x in __import__("os").getloadavg())
    except OSError:
        load = "?"
    print(f"celldialog LLM.loop() overhead: Python {platform.python_version()}, pydantic-ai "
          f"{pydantic_ai.__version__}, load average {load}; {blocks} blocks of ~{block_s} s "
          f"per case after a {warm_s} s warm-up; a run = {K} tool calls + 1 answer = {K + 1} "
          "steps, instant model")
    cases = anyio.run(measure, blocks, block_s, warm_s)
    print(f"{'case':24} {'µs/step med':>12} {'µs/step min':>12} {'CPU µs/step':>12} "
          f"{'runs/block':>11}")
    for c in cases:
        print(f"{c.label:24} {c.median * 1e6:12.1f} {min(c.per_step) * 1e6:12.1f} "
              f"{c.cpu * 1e6:12.1f} {c.per_round:11d}")
    ours = next(c for c in cases if isinstance(c, Ours))
    peer = next(c for c in cases if isinstance(c, PydanticAI))
    ratio, cpu_ratio = peer.median / ours.median, peer.cpu / ours.cpu
    verdict = "ok" if ratio >= TARGET else "FAIL"
    print(f"anchor script as is (pydantic_ai_loop.py {K} 300, subprocess): {anchor_line()}")
    print(f"target: pydantic-ai per step / ours >= {TARGET:g}x: {peer.median * 1e6:,.1f} / "
          f"{ours.median * 1e6:,.1f} µs = {ratio:.2f}x (CPU {cpu_ratio:.2f}x)   {verdict}")


if __name__ == "__main__":
    main()
