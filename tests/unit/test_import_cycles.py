"""No import circles in ``gptmini/`` or ``benchmarks/``: read from the source with ``ast`` (nothing is imported),
lazy imports inside functions included, as are ``if TYPE_CHECKING:`` imports (a circle there is still two
modules that each need the other) and ``importlib.import_module("a.literal")``.

What counts as an edge ``A -> B``, with every module a node and a package's ``__init__.py`` the node named
after the package:

- ``import a.b.c`` and ``from a.b.c import name``: ``A -> a.b.c``; and ``-> a.b.c.name`` as well when
  ``name`` is a submodule (``from gptmini.attention import registry``).
  ``from a.b import name`` where ``name`` is not a submodule reaches ``a.b``'s ``__init__``: the name comes from
  there, so ``A -> a.b``.
- relative imports are resolved against ``A``'s package first.
- The packages above the named module (``a`` and ``a.b`` for ``a.b.c``) are NOT edges: Python always runs a
  parent ``__init__`` before any of its submodules, so a submodule importing a sibling never waits on its
  parent, and a package ``__init__`` that re-exports its submodules is the ordinary shape of a package, not a
  circle. What IS a circle: a submodule importing its own package by name (``from gptmini.x import thing``
  inside ``gptmini/x/y.py`` while ``gptmini/x/__init__.py`` imports ``gptmini.x.y``): the submodule then
  depends on an ``__init__`` that depends on it, and only works if the re-export order happens to suit it.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gptmini", "benchmarks")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under each package folder (a package is named by its folder)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_module_literal(node: ast.AST) -> str | None:
    """The module of ``importlib.import_module("x.y")`` / ``import_module("x.y")`` with a literal name."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    value = node.args[0].value
    return value if name == "import_module" and isinstance(value, str) and not value.startswith(".") else None


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``module`` (read from ``path``) imports, by the rules in this file's
    docstring."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                child = f"{source}.{alias.name}"
                named.add(child if child in modules else source)
        elif (literal := _import_module_literal(node)) is not None:
            named.add(literal)
    return {name for name in named if name in modules and name != module}


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    files = module_files(root, packages)
    return {module: imports_of(module, path, set(files)) for module, path in files.items()}


def _shortest_cycle_through(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest path start -> ... -> start using only modules of ``within`` (one strongly connected set)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & within):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start else [start, start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is on no cycle within {sorted(within)}")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One named cycle per strongly connected group of modules (Tarjan), each as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules (~100)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_shortest_cycle_through(graph, min(group), group) for group in groups]


def test_no_module_of_gptmini_or_benchmarks_is_in_an_import_circle():
    graph = import_graph(REPO_ROOT)
    assert "gptmini.training.run.app" in graph and "benchmarks.cli" in graph
    found = cycles(graph)
    assert not found, "import circles (move the shared part to where both can import it):\n" + "\n".join(
        " -> ".join(cycle) for cycle in found
    )


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(  # a lazy import inside a function closes the circle
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "import pkg.b\n",
                "pkg/b.py": "def f():\n    from pkg.c import g\n",
                "pkg/c.py": "def g():\n    from . import a\n",
            },
            [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]],
            id="lazy-and-relative",
        ),
        pytest.param(  # base imports the package for a name its __init__ re-exports from registry
            {
                "pkg/__init__.py": "",
                "pkg/x/__init__.py": "from pkg.x.base import Base\nfrom pkg.x.registry import REG\n",
                "pkg/x/base.py": "def f():\n    from pkg.x import REG\n",
                "pkg/x/registry.py": "",
            },
            [["pkg.x", "pkg.x.base", "pkg.x"]],
            id="through-package-init",
        ),
        pytest.param(  # `from package import submodule` is an edge to the submodule
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg import b\n",
                "pkg/b.py": "if False:\n    import importlib\n    importlib.import_module('pkg.a')\n",
            },
            [["pkg.a", "pkg.b", "pkg.a"]],
            id="submodule-by-from-and-import_module",
        ),
        pytest.param(  # an __init__ re-exporting submodules that import each other one way is no circle
            {
                "pkg/__init__.py": "from pkg.a import A\nfrom pkg.b import B\n",
                "pkg/a.py": "from .b import B\n",
                "pkg/b.py": "import os\n",
                "pkg/c.py": "from pkg.a import A\nfrom pkg import a, b\n",
            },
            [],
            id="re-exports-only",
        ),
    ],
)
def test_the_walker_finds_the_circles_a_python_import_would_have(tmp_path, files, expected):
    _write(tmp_path, files)
    assert cycles(import_graph(tmp_path, ("pkg",))) == expected
