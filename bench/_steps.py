"""What the per-step benchmarks share (``dialog.py`` part (a), ``conversation.py``): the
clock, a case with its blocks, warm-up and timed blocks, the pydantic-ai peer driven as
``/work/shared/anchors/pydantic_ai_loop.py`` drives it, and the anchor run as a cross-check.

A run is one turn of ``K`` tool calls and a final text (``K + 1`` model steps) against an
instant model, so all of its time is overhead; per step = a block's time / (runs x steps),
wall and CPU (``time.process_time``: every thread of the process, so pydantic-ai's worker
thread counts too). Each run is timed on its own and checked outside its timed span."""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import Span, clock, since

ANCHOR = Path("/work/shared/anchors/pydantic_ai_loop.py")
K = 5  # tool calls of a run; it has K + 1 model steps


class Case:
    """One contender: ``run(m)`` does ``m`` runs and returns their (wall, CPU) time."""

    label = ""
    steps_per_run = K + 1

    def __init__(self) -> None:
        self.per_step: list[float] = []  # wall seconds per step, one per timed block
        self.cpu_per_step: list[float] = []
        self.runs = 0
        self.per_round = 1

    async def run(self, m: int) -> Span:
        raise NotImplementedError

    @property
    def median(self) -> float:
        return statistics.median(self.per_step)

    @property
    def minimum(self) -> float:
        return min(self.per_step)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_per_step)

    @property
    def cpu_minimum(self) -> float:
        return min(self.cpu_per_step)


class PydanticAI(Case):
    """pydantic-ai's agent loop, set up as the anchor sets it up (its script a plain ``def``,
    which pydantic-ai calls on a worker thread). ``async_script=True`` makes the script an
    ``async def`` returning the same response (no thread hop): the leaner use of
    ``FunctionModel``, measured beside the anchor's."""

    label = "pydantic-ai Agent.run"

    def __init__(self, *, async_script: bool = False) -> None:
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

        async def async_script_fn(messages: list[Any], info: AgentInfo) -> ModelResponse:
            return script(messages, info)

        if async_script:
            self.label = f"{PydanticAI.label}, async script"
        self.items: list[str] = []
        self.agent = Agent(FunctionModel(async_script_fn if async_script else script))
        items = self.items

        @self.agent.tool_plain
        def add_item(title: str) -> str:
            """Append an item to the list."""
            items.append(title)
            return f"added {title}"

    async def run(self, m: int) -> Span:
        """``m`` runs, each timed on its own; the checks are outside the timed spans."""
        run = self.agent.run
        self.items.clear()
        wall = cpu = 0.0
        outputs = []
        for _ in range(m):
            t = clock()
            r = await run("add items")
            w, c = since(t)
            wall, cpu = wall + w, cpu + c
            outputs.append(r.output)
        if len(self.items) != K * m or any(o != "done" for o in outputs):
            raise RuntimeError(f"pydantic-ai ran {len(self.items)} tool calls, not {K * m}, "
                               f"or answered other than 'done': {set(outputs)!r}")
        self.runs += m
        return wall, cpu


async def warm_up(case: Case, seconds: float, block_s: float) -> None:
    """Run doubling rounds for ``seconds``, then size a round to about ``block_s``."""
    m, spent, n = 1, 0.0, 0
    while spent < seconds:
        spent += (await case.run(m))[0]
        n += m
        m *= 2
    case.per_round = max(1, round(block_s / (spent / n)))


async def timed_block(case: Case, block_s: float) -> None:
    """Rounds until ``block_s`` of wall time; one per-step figure for the block."""
    gc.collect()
    wall = cpu = 0.0
    n = 0
    while wall < block_s or n == 0:
        w, c = await case.run(case.per_round)
        wall, cpu, n = wall + w, cpu + c, n + case.per_round
    case.per_step.append(wall / (n * case.steps_per_run))
    case.cpu_per_step.append(cpu / (n * case.steps_per_run))


def anchor_line(runs: int = 300) -> str:
    """The anchor script as it is, in a subprocess (its own warm-up, ``runs`` runs)."""
    if not ANCHOR.exists():
        return f"{ANCHOR} not found"
    try:
        out = subprocess.run([sys.executable, str(ANCHOR), str(K), str(runs)], capture_output=True,
                             text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not run: {e}"
    return out.stdout.strip() or "failed: " + (out.stderr.strip().splitlines() or ["?"])[-1]
