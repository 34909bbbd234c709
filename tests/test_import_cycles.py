"""No import cycle inside the triage package: every module imports only modules below it in the flow.

The graph is read from the source with `ast`, so nothing is imported. Every
import statement counts, at module level and inside functions alike: a lazy
import inside a function still runs, and an upward one is the same design
problem, only deferred. An edge goes to the module an import names: for
`from pkg import name` that is `pkg.name` when it is a submodule, else `pkg`
(its `__init__`). Parent packages a submodule import executes implicitly are
not edges; otherwise a package `__init__` that exposes anything from its own
children would be "in a cycle" with each of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "triage"


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file of the package."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in its source)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    graph[name].add(_nearest_module(alias.name, modules))
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_package)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    graph[name].add(submodule if submodule in modules else _nearest_module(base, modules))
        graph[name].discard(None)  # type: ignore[arg-type]
        graph[name].discard(name)
    return graph


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    if not is_package:
        parts.pop()
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _nearest_module(dotted: str, modules: dict[str, Path]) -> str | None:
    """`dotted` itself, or the longest prefix of it that is one of the package's modules (None outside it)."""
    parts = dotted.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module: each holds at least one cycle (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A shortest cycle through each tangle."""
    return [shortest_cycle(graph, component) for component in tangles(graph)]


def shortest_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, for the failure message."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    return paths[node] + [start]
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    return sorted(component)


def test_the_triage_package_has_no_import_cycle():
    modules = module_files()
    assert "triage.kb.matcher" in modules and "triage.runner.child" in modules  # the walk found the package
    graph = import_graph(modules)
    shown = []
    for component in tangles(graph):
        edges = [f"{a} -> {b}" for a in sorted(component) for b in sorted(graph[a] & component)]
        shown.append("  " + " -> ".join(shortest_cycle(graph, component)) + "\n    all imports in this tangle: "
                     + "; ".join(edges))
    assert not shown, "import cycles:\n" + "\n".join(shown)


def test_the_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def later():\n    from .. import c\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "leaf.py").write_text("from pkg.sub import b\n")
    graph = import_graph(module_files(package))
    assert graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.leaf"] == {"pkg.sub.b"}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
