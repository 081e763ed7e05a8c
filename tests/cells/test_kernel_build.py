"""Which reactive kernel runs: the compiled build where it exists and matches its source, the
pure-Python source when asked (``CELLDIALOG_PURE_KERNEL=1``), missing, or stale.

The kernel's behaviour is tested by ``test_signals.py`` and the rest of ``tests/cells``, which
CI runs against both kernels. CI sets ``CELLDIALOG_EXPECT_COMPILED=1`` where its build must
have produced the compiled one, so a build that silently fell back fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from runtime.cells import _kernel as kernel
from runtime.cells import equality, signals

CELLS = Path(signals.__file__).resolve().parent
BUILT = [p for s in EXTENSION_SUFFIXES if (p := CELLS / f"_kernel{s}").exists()]
PURE_ASKED = os.environ.get(signals.PURE_ENV, "") not in ("", "0")
needs_build = pytest.mark.skipif(not BUILT, reason="no compiled kernel built for this Python")


def _which(env: dict[str, str], path: Path | None = None) -> tuple[str, str, str]:
    """(COMPILED, the kernel module's file name, stderr) in a fresh interpreter."""
    code = ("from runtime.cells import signals, _kernel; "
            "print(signals.COMPILED, _kernel.__file__.rsplit('/', 1)[-1])")
    env = {k: v for k, v in os.environ.items() if k != signals.PURE_ENV} | env
    if path is not None:
        env["PYTHONPATH"] = str(path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=path or CELLS.parent.parent, timeout=60, check=True)
    compiled, name = proc.stdout.split()
    return compiled, name, proc.stderr


def test_the_kernel_that_runs_is_the_one_announced() -> None:
    assert sys.modules["runtime.cells._kernel"] is kernel
    assert signals.Signal is kernel.Signal and equality.same is kernel.same
    is_python = isinstance(kernel.Signal.get, types.FunctionType)
    assert signals.COMPILED is not is_python
    assert Path(kernel.__file__ or "").suffix == (".so" if signals.COMPILED else ".py")
    assert signals.KERNEL.startswith("compiled" if signals.COMPILED else "pure Python")


def test_the_compiled_kernel_is_what_loads_when_the_build_produced_it() -> None:
    if PURE_ASKED:
        assert not signals.COMPILED and signals.PURE_ENV in signals.KERNEL
        return
    if os.environ.get("CELLDIALOG_EXPECT_COMPILED") == "1":
        assert BUILT, "CI's build should have compiled the kernel: see setup.py's stderr"
    if not BUILT:
        pytest.skip("no compiled kernel built for this Python")
    assert signals.COMPILED, signals.KERNEL
    assert Path(kernel.__file__ or "") in BUILT


@needs_build
def test_the_switch_forces_the_pure_kernel_and_0_does_not() -> None:
    assert _which({signals.PURE_ENV: "1"})[:2] == ("False", "_kernel.py")
    assert _which({signals.PURE_ENV: "0"})[:2] == ("True", BUILT[0].name)


@needs_build
def test_a_build_of_other_source_is_not_loaded(tmp_path: Path) -> None:
    """An edited ``_kernel.py`` in an editable install: its old build must not run."""
    copy = tmp_path / "runtime" / "cells"
    copy.mkdir(parents=True)
    shutil.copy(CELLS.parent / "errors.py", copy.parent)
    for p in (*CELLS.glob("_kernel*"), CELLS / "signals.py", CELLS / "equality.py"):
        shutil.copy(p, copy)
    for package in (copy.parent, copy):  # the kernel alone, none of the graph above it
        (package / "__init__.py").write_text("")

    assert _which({}, tmp_path)[:2] == ("True", BUILT[0].name)  # the copy as built
    with (copy / "_kernel.py").open("a") as f:
        f.write("\n# edited\n")
    compiled, name, stderr = _which({}, tmp_path)
    assert (compiled, name) == ("False", "_kernel.py")
    assert "not built from this _kernel.py" in stderr and "pip install" in stderr
