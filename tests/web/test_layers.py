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


def test_the_web_package_uses_the_cell_graphs_front_only() -> None:
    reached = {n for p in (RUNTIME / "web").glob("*.py") for n in imports(p)
               if n.startswith(("runtime.cells.", "runtime.storage", "runtime.builtins."))}
    # names imported from the front itself (runtime.cells.X where X is in its __all__)
    import runtime.cells as front

    submodules = {n for n in reached if n.removeprefix("runtime.cells.") not in front.__all__}
    assert submodules == set()
