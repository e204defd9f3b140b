"""No import circle in ``edge/``: every module can be read, and changed, after those it uses.

An import inside a function or under ``TYPE_CHECKING`` counts: a lazy import that closes a
circle hides it from Python's import order, not from the reader.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import edge

EDGE = Path(edge.__file__).parent


def module_name(source: Path, root: Path) -> str:
    parts = source.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: Path, module: str) -> Iterator[str]:
    """Every dotted name ``source`` imports, wherever in the file the import stands."""
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # ``from edge.x import y`` imports the module edge.x.y when there is one.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``root``'s package it imports (the deepest module a name
    reaches: ``edge.web.app.CACHE`` is ``edge.web.app``)."""
    sources = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}

    def owner(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        targets = {owner(name) for name in imported_names(source, module)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle as the path that closes it (first module repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph[module]):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done and (cycle := visit(target)):
                return cycle
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (cycle := visit(module)):
            return cycle
    return None


def test_the_finder_sees_a_circle_closed_by_a_lazy_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    assert find_cycle(import_graph(package)) == ["pkg.a", "pkg.sub.b", "pkg.a"]


def test_edge_has_no_import_circle() -> None:
    graph = import_graph(EDGE)
    assert graph["edge.web.app"]  # it read the real package
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])
