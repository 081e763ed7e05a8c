"""runtime/web is a room of its own: nothing below imports it, and it sees the cell graph
only through its public front (``runtime.cells``), never a submodule."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def imports(path: Path) -> list[str]:
    """Absolute names of what ``path`` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(RUNTIME.parent).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names += [module] + [f"{module}.{a.name}" for a in node.names]
    return names


def test_nothing_below_imports_the_web_package() -> None:
    below = [p for p in RUNTIME.rglob("*.py")
             if not p.is_relative_to(RUNTIME / "web") and not p.is_relative_to(RUNTIME / "cli")]
    assert len(below) > 50
    offenders = {str(p.relative_to(RUNTIME)) for p in below
                 if any(n == "runtime.web" or n.startswith("runtime.web.") for n in imports(p))}
    assert offenders == set()


def test_the_web_package_stands_on_the_fronts_of_the_rooms_below() -> None:
    """What runtime/web imports of the project: the cell graph's and the builtins' fronts
    (names in their ``__all__``), the error tree, and itself; of the rest, the standard
    library and the web extra's packages."""
    import sys

    import runtime.builtins as builtins
    import runtime.cells as cells

    fronts = {"runtime.cells": set(cells.__all__), "runtime.builtins": set(builtins.__all__)}
    allowed_packages = {"starlette", "sse_starlette", "anyio", "pydantic", "platformdirs"}
    wrong = set()
    for path in (RUNTIME / "web").glob("*.py"):
        for name in imports(path):
            top = name.split(".")[0]
            if name.startswith("runtime."):
                front, _, member = name.rpartition(".")
                if name in fronts or name.startswith(("runtime.web", "runtime.errors")):
                    continue
                if front in fronts and member in fronts[front]:
                    continue
                wrong.add((path.name, name))
            elif top not in sys.stdlib_module_names and top not in allowed_packages \
                    and top != "__future__":
                wrong.add((path.name, name))
    assert wrong == set()
