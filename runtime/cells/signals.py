"""The reactive kernel's front: ``Signal``, ``Computed``, ``Effect``, ``batch``, ``untracked``,
``current_subscriber``, ``in_computation``, and the value gate ``same`` (``equality.py``
names it for the rest). How they work: ``_kernel.py``.

The kernel has one source, ``_kernel.py``. Where the package was built with a C compiler,
mypyc compiled that source into an extension module beside it (``setup.py``), with the hash
of the source it was built from in ``_kernel.sha256``. This module loads that build, or else
the source itself, at import; ``COMPILED`` says which runs and ``KERNEL`` why. The source
runs when:

- ``CELLDIALOG_PURE_KERNEL=1`` is set (read once, at import): CI runs the kernel's tests
  against both;
- there is no build for this interpreter (no C compiler or mypyc at install time, or
  ``CELLDIALOG_NO_COMPILE=1``);
- the build came from other source than the ``_kernel.py`` beside it (the kernel was edited
  in an editable install; ``pip install --no-deps -e .`` rebuilds it), or it fails to load.
  Both warn: running stale compiled code would be worse than running slower.

Either way ``runtime.cells._kernel`` in ``sys.modules`` is the one chosen.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import CycleError, WriteInComputationError

__all__ = [
    "COMPILED",
    "KERNEL",
    "MAX_DEPTH",
    "Computed",
    "CycleError",
    "Effect",
    "Signal",
    "WriteInComputationError",
    "batch",
    "current_subscriber",
    "in_computation",
    "same",
    "untracked",
]

PURE_ENV = "CELLDIALOG_PURE_KERNEL"
HASH_FILE = "_kernel.sha256"  # beside the build: the sha256 of the source it was built from
_HERE = Path(__file__).resolve().parent
_SOURCE = _HERE / "_kernel.py"
_NAME = f"{__package__}._kernel"


def _source_hash(path: Path) -> str:
    """The hash a build records of the source it compiled (``setup.py`` writes it)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compiled_build() -> tuple[Path | None, str]:
    """(the usable compiled kernel, or None; why not)."""
    built = next((p for s in EXTENSION_SUFFIXES if (p := _HERE / f"_kernel{s}").exists()), None)
    if built is None:
        return None, "no compiled build for this interpreter"
    try:
        recorded = (_HERE / HASH_FILE).read_text().strip()
    except OSError:
        recorded = ""
    if _SOURCE.exists() and recorded != _source_hash(_SOURCE):
        why = (f"the compiled kernel {built.name} was not built from this _kernel.py "
               "(edited since?); rebuild it with `pip install --no-deps -e .`")
        warnings.warn(f"celldialog: running the pure-Python kernel: {why}", stacklevel=3)
        return None, why
    return built, f"compiled by mypyc: {built.name}"


def _load(path: Path) -> ModuleType:
    spec = spec_from_file_location(_NAME, path)
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    sys.modules[_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
        raise
    return module


def _choose() -> tuple[ModuleType, bool, str]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return _load(_SOURCE), False, f"pure Python: {PURE_ENV} is set"
    built, why = _compiled_build()
    if built is not None:
        try:
            return _load(built), True, why
        except ImportError as e:
            why = f"the compiled kernel {built.name} does not load ({e})"
            warnings.warn(f"celldialog: running the pure-Python kernel: {why}", stacklevel=3)
    return _load(_SOURCE), False, f"pure Python: {why}"


_kernel, COMPILED, KERNEL = _choose()
setattr(sys.modules[__package__], "_kernel", _kernel)  # noqa: B010  (as an import would)

if TYPE_CHECKING:
    from ._kernel import (
        MAX_DEPTH,
        Computed,
        Effect,
        Signal,
        batch,
        current_subscriber,
        in_computation,
        same,
        untracked,
    )
else:
    MAX_DEPTH = _kernel.MAX_DEPTH
    Computed = _kernel.Computed
    Effect = _kernel.Effect
    Signal = _kernel.Signal
    batch = _kernel.batch
    current_subscriber = _kernel.current_subscriber
    in_computation = _kernel.in_computation
    same = _kernel.same
    untracked = _kernel.untracked
