"""Instructions per dialog step, counted by callgrind: a figure that does not move with load.

    python bench/dialog_instructions.py                     # this checkout
    python bench/dialog_instructions.py --against ../old    # and another checkout, side by side
    python bench/dialog_instructions.py --setup             # per rt.run instead of per step

Wall and CPU time on a shared 2-core machine swing by 20% between runs, too much to tell
whether a change made a step a few percent dearer. ``valgrind --tool=callgrind`` counts the
instructions the process executes, which repeats to within a fraction of a percent. The
work is (a) of ``bench/dialog.py``: turns of 5 handler-tool steps and a final text on the
memory store, against an instant ``ScriptedModel``. Each checkout runs twice, with
``--short`` and ``--long`` measured turns after the same warm-up; the difference divided by
the extra steps is the cost of one step, without the interpreter's start and the imports.
``--setup`` counts (e) of ``bench/dialog.py`` instead: ``rt.run`` of the dialog pattern on
the memory store, new sessions, 50 runs of warm-up, then 50 and 250 measured runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS_PER_TURN = 6
WARM_UP = 50

_CHILD = """
import sys, anyio
root = sys.argv[1]
sys.path.insert(0, root); sys.path.insert(0, root + "/bench")
import dialog as d
from runtime import Runtime
from runtime.llm import ScriptedModel

async def main(turns):
    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        inst = rt.run(d.agent, session="a")
        messages, items = inst.result.key("messages"), inst.result.key("items")
        for _ in range(turns):
            messages.set([]); items.set([]); model.requests.clear()
            model.add(*d.turn_script(5))
            await inst.send("send", "add items")
            await rt.settled()

anyio.run(main, int(sys.argv[2]))
"""

_SETUP_CHILD = """
import sys, anyio
root = sys.argv[1]
sys.path.insert(0, root); sys.path.insert(0, root + "/bench")
import dialog as d
from runtime import Runtime

async def main(runs):
    async with Runtime(model=d.PrebuiltModel(d.CONC_TOOLS)) as rt:
        for i in range(runs):
            rt.run(d.agent, session=f"s{i}")

anyio.run(main, int(sys.argv[2]))
"""


def instructions(root: Path, turns: int, child: str = _CHILD) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, "-c", child, str(root), str(turns)],
            capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed for {root}:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def per_step(root: Path, short: int, long: int) -> float:
    a = instructions(root, WARM_UP + short)
    b = instructions(root, WARM_UP + long)
    return (b - a) / ((long - short) * STEPS_PER_TURN)


def per_run(root: Path) -> float:
    """Instructions per ``rt.run`` of the dialog pattern (``--setup``)."""
    a = instructions(root, WARM_UP + 50, _SETUP_CHILD)
    b = instructions(root, WARM_UP + 250, _SETUP_CHILD)
    return (b - a) / 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout to count beside this one")
    parser.add_argument("--short", type=int, default=10, help="measured turns, first run")
    parser.add_argument("--long", type=int, default=110, help="measured turns, second run")
    parser.add_argument("--setup", action="store_true",
                        help="count rt.run of the dialog pattern instead of a step")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.long <= args.short:
        raise SystemExit("--long must be more turns than --short")
    what = "rt.run of the dialog pattern" if args.setup else "dialog step"

    def count(root: Path) -> float:
        return per_run(root) if args.setup else per_step(root, args.short, args.long)

    ours = count(ROOT)
    print(f"this checkout ({ROOT}): {ours:,.0f} instructions per {what}")
    if args.against is not None:
        theirs = count(args.against.resolve())
        print(f"{args.against}: {theirs:,.0f} instructions per {what}")
        print(f"this / that: {ours / theirs:.3f}")


if __name__ == "__main__":
    main()
