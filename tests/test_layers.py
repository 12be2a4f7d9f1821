"""The layers of the package, read from its source: what imports what.

Every import counts, at module level or inside a function (a lazy import is still an
arrow), except those under ``if TYPE_CHECKING:``, which never run. The viewer never
imports the CLI; the wording both use (``agentjournal.summaries``) imports neither, nor
a terminal or web library; and no import circle is left where issue 44 found one.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import pytest

import agentjournal

PACKAGE = Path(agentjournal.__file__).parent

#: module -> {what it imports: the line of its first import}. A module of the package is
#: named in full (``agentjournal.cli.reading``); anything else by its top-level name
#: (``click``).
Graph = dict[str, dict[str, int]]

#: Libraries for a terminal or a web page: the CLI's and the viewer's, never the wording's.
PRESENTATION = ("click", "rich", "starlette", "jinja2", "uvicorn")


def module_files(root: Path) -> dict[str, Path]:
    """Each module of the package at ``root`` by its dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path = PACKAGE) -> Graph:
    """What each module of the package at ``root`` imports."""
    files = module_files(root)
    return {name: _imports(name, path, files) for name, path in files.items()}


def _imports(name: str, path: Path, files: dict[str, Path]) -> dict[str, int]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target.partition(".")[0] != name.partition(".")[0]:
            target = target.partition(".")[0]  # another library: by its top-level name
        else:
            while target not in files:  # (a name in a module, not a module: its module)
                target = target.rpartition(".")[0]
        if target != name:
            found.setdefault(target, line)

    for node in _running_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:  # `from . import x`: x may be a module itself
                named = f"{origin}.{alias.name}"
                add(named if named in files else origin, node.lineno)
    return found


def _running_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node of ``tree``, functions' bodies included, but not what sits under
    ``if TYPE_CHECKING:`` (its ``else:`` runs, so it is kept)."""
    todo: deque[ast.AST] = deque([tree])
    while todo:
        node = todo.popleft()
        yield node
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def path_between(graph: Graph, start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports from ``start`` to ``goal``; None when there is none."""
    came_from: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        module = todo.popleft()
        if module == goal:
            chain: list[str] = []
            step: str | None = module
            while step is not None:
                chain.append(step)
                step = came_from[step]
            return chain[::-1]
        for target in graph.get(module, {}):
            if target not in came_from:
                came_from[target] = module
                todo.append(target)
    return None


def circle_through(graph: Graph, modules: Iterable[str]) -> list[str] | None:
    """An import circle through two of ``modules`` (each reaches the other), as the chain
    of imports that goes round it; None when there is none."""
    for a, b in itertools.combinations(modules, 2):
        there, back = path_between(graph, a, b), path_between(graph, b, a)
        if there and back:
            return there + back[1:]
    return None


def in_layer(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def said(chain: list[str], graph: Graph) -> str:
    """An import chain, with the line of each import: ``a (line 3) -> b``."""
    return " -> ".join(f"{m} (line {graph[m][n]})" for m, n in itertools.pairwise(chain)
                       ) + f" -> {chain[-1]}"


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph()


def test_the_graph_holds_lazy_imports_and_leaves_out_type_checking_ones(tmp_path: Path) -> None:
    # (a check of the checker: a graph that missed lazy imports would pass everything)
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("import click\n\ndef f():\n    from .sub import b\n")
    (root / "sub" / "b.py").write_text("from .. import a\n")
    (root / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from pkg import a\nelse:\n    import pkg.sub.b\n")
    graph = import_graph(root)
    assert graph["pkg.a"] == {"click": 1, "pkg.sub.b": 4}
    assert graph["pkg.c"] == {"typing": 1, "pkg.sub.b": 5}
    assert circle_through(graph, ["pkg.a", "pkg.sub.b"]) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    assert circle_through(graph, ["pkg.a", "pkg.c"]) is None


def test_the_viewer_never_imports_the_cli(graph: Graph) -> None:
    arrows = [f"{module} (line {line}) imports {target}"
              for module, targets in graph.items() if in_layer(module, "agentjournal.ui")
              for target, line in targets.items() if in_layer(target, "agentjournal.cli")]
    assert not arrows, ("the viewer imports the CLI; what both need belongs below both "
                        "(agentjournal.summaries): " + "; ".join(arrows))


@pytest.mark.parametrize("above", ["agentjournal.cli", "agentjournal.ui", *PRESENTATION])
def test_the_wording_imports_nothing_above_it(graph: Graph, above: str) -> None:
    """The wording is below the CLI and the viewer, and prints nothing: not even through
    another module does it import them or a terminal or web library."""
    assert "agentjournal.summaries" in graph, "no agentjournal/summaries.py: the wording is gone"
    chains = [chain for target in graph if in_layer(target, above) or target == above
              if (chain := path_between(graph, "agentjournal.summaries", target))]
    assert not chains, f"agentjournal.summaries reaches {above}: {said(chains[0], graph)}"


def test_no_circle_between_the_journal_and_the_workspace(graph: Graph) -> None:
    circle = circle_through(graph, ["agentjournal.journal", "agentjournal.workspace"])
    assert circle is None, f"an import circle: {said(circle, graph)}"


def test_no_circle_among_the_bench_modules(graph: Graph) -> None:
    circle = circle_through(graph, ["agentjournal.bench.command", "agentjournal.bench.fleet",
                                    "agentjournal.bench.targets"])
    assert circle is None, f"an import circle: {said(circle, graph)}"
