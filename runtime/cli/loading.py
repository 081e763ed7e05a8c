"""From the PATTERN argument to a ``Pattern``: a file, ``module:name``, or a bundled name.

Tried in this order, so what a user types means one thing:

1. ``path/to/app.py`` or ``path/to/app.py:name``: the file is imported as module ``app``
   (the identity its patterns get when ``python app.py`` runs them, so the documents are the
   same either way); without ``:name`` it must define exactly one pattern.
2. ``package.module:name``: imported from ``sys.path`` (the current directory included).
3. a bundled pattern of ``patterns/``: by its identity (``bundled.chatbot``), that without
   the ``bundled.`` prefix (``chatbot``, ``todo-agent``) or its module (``todo_agent``).

Anything else is ``PatternNotUsable`` naming what was tried and what exists.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .errors import PatternNotUsable

if TYPE_CHECKING:
    from ..cells import Pattern

__all__ = ["DEFAULT_CHAT_PATTERN", "bundled_patterns", "load_pattern"]

DEFAULT_CHAT_PATTERN = "bundled.chatbot"


def _patterns_in(module: ModuleType) -> dict[str, Pattern]:
    """The patterns a module defines (not those it imported from elsewhere)."""
    from ..cells import Pattern

    return {name: value for name, value in vars(module).items()
            if isinstance(value, Pattern)
            and getattr(value, "__module__", module.__name__) == module.__name__}


def _import_file(path: Path) -> ModuleType:
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    if spec is None or spec.loader is None:
        raise PatternNotUsable(f"cannot import {str(path)!r}: not a Python source file")
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) != str(path.resolve()):
        raise PatternNotUsable(
            f"cannot import {str(path)!r} as module {name!r}: that name is taken by "
            f"{getattr(loaded, '__file__', None) or 'a built-in module'}; rename the file")
    module = importlib.util.module_from_spec(spec)
    # its own directory first, as `python app.py` would have it: sibling imports work
    sys.path.insert(0, str(path.parent.resolve()))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise PatternNotUsable(
            f"importing {str(path)!r} failed: {type(e).__name__}: {e}") from None
    return module


def _import_module(name: str) -> ModuleType:
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # `module:name` is looked for where the user stands too
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):  # the module itself (or its package)
            raise PatternNotUsable(
                f"no module named {name!r} (looked on sys.path and in the current "
                "directory); for a file give its path: path/to/app.py") from None
        raise PatternNotUsable(
            f"importing {name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:
        raise PatternNotUsable(f"importing {name!r} failed: {type(e).__name__}: {e}") from None


def _pick(module: ModuleType, attr: str | None, where: str) -> Pattern:
    from ..cells import Pattern

    if attr is not None:
        value = getattr(module, attr, None)
        if isinstance(value, Pattern):
            return value
        found = ", ".join(sorted(_patterns_in(module))) or "none"
        what = "nothing" if value is None else f"a {type(value).__name__}, not a @pattern"
        raise PatternNotUsable(f"{where}:{attr} is {what}; the patterns in {where}: {found}")
    patterns = _patterns_in(module)
    if len(patterns) == 1:
        return next(iter(patterns.values()))
    if not patterns:
        raise PatternNotUsable(f"{where} defines no @pattern")
    names = ", ".join(sorted(patterns))
    raise PatternNotUsable(
        f"{where} defines several patterns ({names}): name one, as {where}:{sorted(patterns)[0]}")


def bundled_patterns() -> dict[str, Pattern]:
    """Every name a bundled pattern answers to (identity, short name, module name)."""
    import patterns as package

    names: dict[str, Pattern] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found = _patterns_in(module)
        for attr, p in found.items():
            short = p.key.removeprefix("bundled.")
            for name in (p.key, short, attr, *((info.name,) if len(found) == 1 else ())):
                names.setdefault(name, p)
    return names


def bundled_names() -> list[str]:
    """The shortest name of each bundled pattern, for messages and help."""
    shortest: dict[int, str] = {}
    for name, p in bundled_patterns().items():
        if id(p) not in shortest or len(name) < len(shortest[id(p)]):
            shortest[id(p)] = name
    return sorted(shortest.values())


def load_pattern(spec: str) -> Pattern:
    """The pattern ``spec`` names (see the module docstring); ``PatternNotUsable`` if none."""
    spec = spec.strip()
    if not spec:
        raise PatternNotUsable("PATTERN is empty: give a file, module:name or bundled name")
    head, sep, attr = spec.rpartition(":")
    target, name = (head, attr) if sep and head and attr else (spec, None)
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise PatternNotUsable(f"no such file {target!r}")
        return _pick(_import_file(path), name, target)
    if name is not None:
        return _pick(_import_module(target), name, target)
    bundled = bundled_patterns()
    if spec in bundled:
        return bundled[spec]
    raise PatternNotUsable(
        f"unknown pattern {spec!r}: give a file (app.py), a module:name, or a bundled "
        f"pattern: {', '.join(bundled_names())}")
