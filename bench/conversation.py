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
import gc
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime import LLM  # noqa: E402
from runtime.llm import Reply, ScriptedModel, call  # noqa: E402

ANCHOR = Path("/work/shared/anchors/pydantic_ai_loop.py")
K = 5  # tool calls of a run; it has K + 1 model steps
TARGET = 10.0  # pydantic-ai per-step time / ours, at least

Span = tuple[float, float]  # (wall seconds, CPU seconds)


def clock() -> Span:
    return time.perf_counter(), time.process_time()


def since(start: Span) -> Span:
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


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


class Case:
    label = ""

    def __init__(self) -> None:
        self.per_step: list[float] = []
        self.cpu_per_step: list[float] = []
        self.per_round = 1

    async def run(self, m: int) -> Span:
        raise NotImplementedError

    @property
    def median(self) -> float:
        return statistics.median(self.per_step)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_per_step)


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


class Peer(Case):
    label = "pydantic-ai Agent.run"

    def __init__(self) -> None:
        super().__init__()
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel

        def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
            calls = sum(1 for m in messages for p in getattr(m, "parts", [])
                        if p.part_kind == "tool-return")
            if calls < K:
                return ModelResponse(parts=[ToolCallPart("add_item", {"title": f"item {calls}"})])
            return ModelResponse(parts=[TextPart("done")])

        self.items: list[str] = []
        self.agent = Agent(FunctionModel(script))
        items = self.items

        @self.agent.tool_plain
        def add_item(title: str) -> str:
            """Append an item to the list."""
            items.append(title)
            return f"added {title}"

    async def run(self, m: int) -> Span:
        self.items.clear()
        t = clock()
        for _ in range(m):
            r = await self.agent.run("add items")
            assert r.output == "done"
        dt = since(t)
        if len(self.items) != K * m:
            raise RuntimeError(f"pydantic-ai ran {len(self.items)} tool calls, not {K * m}")
        return dt


async def warm_up(case: Case, seconds: float, block_s: float) -> None:
    m, spent, n = 1, 0.0, 0
    while spent < seconds:
        spent += (await case.run(m))[0]
        n += m
        m *= 2
    case.per_round = max(1, round(block_s / (spent / n)))


async def timed_block(case: Case, block_s: float) -> None:
    gc.collect()
    wall = cpu = 0.0
    n = 0
    while wall < block_s or n == 0:
        w, c = await case.run(case.per_round)
        wall, cpu, n = wall + w, cpu + c, n + case.per_round
    case.per_step.append(wall / (n * (K + 1)))
    case.cpu_per_step.append(cpu / (n * (K + 1)))


async def measure(blocks: int, block_s: float, warm_s: float) -> list[Case]:
    cases: list[Case] = [Ours(), Peer()]
    for case in cases:
        await warm_up(case, warm_s, block_s)
    rng = random.Random(7)
    for _ in range(blocks):
        rng.shuffle(cases)
        for case in cases:
            await timed_block(case, block_s)
    return sorted(cases, key=lambda c: c.label)


def anchor_line() -> str:
    if not ANCHOR.exists():
        return f"{ANCHOR} not found"
    try:
        out = subprocess.run([sys.executable, str(ANCHOR), str(K), "300"], capture_output=True,
                             text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not run: {e}"
    return out.stdout.strip() or "failed: " + (out.stderr.strip().splitlines() or ["?"])[-1]


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
    peer = next(c for c in cases if isinstance(c, Peer))
    ratio, cpu_ratio = peer.median / ours.median, peer.cpu / ours.cpu
    verdict = "ok" if ratio >= TARGET else "FAIL"
    print(f"anchor script as is (pydantic_ai_loop.py {K} 300, subprocess): {anchor_line()}")
    print(f"target: pydantic-ai per step / ours >= {TARGET:g}x: {peer.median * 1e6:,.1f} / "
          f"{ours.median * 1e6:,.1f} µs = {ratio:.2f}x (CPU {cpu_ratio:.2f}x)   {verdict}")


if __name__ == "__main__":
    main()
