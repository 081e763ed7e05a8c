"""Finding the evals a path or an import path names (``celldialog eval EVALS``).

``EVALS`` is one of:

- a directory: every ``*.py`` in it (not starting with ``_``), in name order. A directory
  with ``__init__.py`` is imported as the package it is (its parent put on ``sys.path``), so
  its files import each other as ``package.module``; otherwise each file is imported as a
  top-level module, its directory on ``sys.path``;
- a file ``path/to/evals.py``, optionally ``path/to/evals.py:name`` for one eval;
- ``package.module`` or ``package.module:name``.

A module's evals are its ``EVALS`` list when it has one, else every ``Eval`` /
``PatternEval`` instance at module level, then every concrete subclass defined there with no
instance there (made with no arguments; a class whose name starts with ``_`` is a base,
skipped), each in definition order.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

from ..errors import CelldialogError
from .core import BaseEval, Eval
from .patterns import PatternEval

__all__ = ["EvalLoadError", "evals_in", "load_evals"]


class EvalLoadError(CelldialogError):
    """EVALS names nothing that holds evals, or a module that fails to import."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


def load_evals(spec: str | Path) -> list[BaseEval]:
    """The evals ``spec`` names (see the module docstring)."""
    text = str(spec).strip()
    if not text:
        raise EvalLoadError("EVALS is empty: give a directory, a file or a module",
                            not_found=True)
    head, sep, attr = text.rpartition(":")
    target, name = (head, attr) if sep and head and attr and not _drive(text) else (text, None)
    path = Path(target)
    if path.is_dir():
        if name is not None:
            raise EvalLoadError(f"{target!r} is a directory: pick an eval with --only NAME")
        files = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
        if not files:
            raise EvalLoadError(f"{target!r} holds no Python files (*.py)", not_found=True)
        found: list[BaseEval] = []
        for f in files:
            found += evals_in(_import_file(f))
        return _checked(found, target)
    if target.endswith(".py") or path.is_file() or "/" in target or "\\" in target:
        if not path.is_file():
            raise EvalLoadError(f"no such file or directory {target!r}", not_found=True)
        return _checked(_pick(evals_in(_import_file(path)), name, target), target)
    module = _import_module(target)
    return _checked(_pick(evals_in(module), name, target), target)


def evals_in(module: ModuleType) -> list[BaseEval]:
    """The evals a module defines (see the module docstring)."""
    listed = getattr(module, "EVALS", None)
    if listed is not None:
        items = list(listed)
        bad = [x for x in items if not isinstance(x, BaseEval)]
        if bad:
            raise EvalLoadError(f"{module.__name__}.EVALS holds {bad[0]!r}, not an Eval "
                                "instance")
        return items
    found: list[BaseEval] = []
    for value in vars(module).values():
        if isinstance(value, BaseEval) and all(value is not x for x in found):
            found.append(value)
    made = {type(x) for x in found}  # a class with an instance here is that instance
    for name, value in vars(module).items():
        if (isinstance(value, type) and issubclass(value, BaseEval) and value not in made
                and value not in (BaseEval, Eval, PatternEval) and not name.startswith("_")
                and value.__module__ == module.__name__ and not inspect.isabstract(value)):
            try:
                found.append(value())
            except TypeError as e:
                raise EvalLoadError(
                    f"{module.__name__}.{name} cannot be made with no arguments ({e}): give "
                    "its parameters defaults, put an instance in the module, or name the "
                    "class with a leading _ if it is a base") from None
    return found


def _pick(found: list[BaseEval], name: str | None, where: str) -> list[BaseEval]:
    if name is None:
        return found
    chosen = [e for e in found if e.name == name]
    if not chosen:
        have = ", ".join(e.name for e in found) or "none"
        raise EvalLoadError(f"{where} has no eval named {name!r}; its evals: {have}",
                            not_found=True)
    return chosen


def _checked(found: list[BaseEval], where: str) -> list[BaseEval]:
    if not found:
        raise EvalLoadError(
            f"{where} defines no evals: subclass runtime.evals.Eval or PatternEval, or use "
            "@evaluation(prompt=...)", not_found=True)
    return found


def _drive(text: str) -> bool:
    return len(text) > 2 and text[1] == ":" and text[0].isalpha() and text[2] in "\\/"


def _import_file(path: Path) -> ModuleType:
    path = path.resolve()
    if (path.parent / "__init__.py").is_file():
        package = path.parent.name
        parent = str(path.parent.parent)
        if parent not in sys.path:
            sys.path.insert(0, parent)
        loaded = sys.modules.get(package)
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "").parent != path.parent:
            raise EvalLoadError(
                f"cannot import {str(path)!r} as part of package {package!r}: that name is "
                f"taken by {getattr(loaded, '__file__', None) or 'a built-in module'}; rename "
                "the directory")
        return _import_module(f"{package}.{path.stem}", str(path))
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__file__", None) == str(path):
            return loaded
        raise EvalLoadError(
            f"cannot import {str(path)!r} as module {name!r}: that name is taken by "
            f"{getattr(loaded, '__file__', None) or 'a built-in module'}; rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise EvalLoadError(f"cannot import {str(path)!r}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # sibling imports, as `python file.py` has them
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise EvalLoadError(f"importing {str(path)!r} failed: {type(e).__name__}: {e}") from None
    return module


def _import_module(name: str, shown: str | None = None) -> ModuleType:
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise EvalLoadError(
                f"no module named {name!r} (looked on sys.path and in the current directory); "
                "for a file or a directory give its path", not_found=True) from None
        raise EvalLoadError(
            f"importing {shown or name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:
        raise EvalLoadError(
            f"importing {shown or name!r} failed: {type(e).__name__}: {e}") from None
