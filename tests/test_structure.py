"""The code's shape: the modules of each package import one another one way (no import cycle)."""

import ast

from conftest import REPO


def module_name(path) -> str:
    """``tfapprox/data/letor.py`` -> ``tfapprox.data.letor``; a package's ``__init__.py`` -> its name."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere in it, function-local imports too.

    ``from P import n`` imports the module ``P.n`` when there is one, else (a name from it) ``P``.
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                         else node.module for alias in node.names)
    return found & modules


def import_graph(*packages: str) -> dict[str, set[str]]:
    """``{module: the modules of packages it imports}`` for every module under ``REPO/<package>``."""
    paths = {module_name(p): p for package in packages for p in (REPO / package).rglob("*.py")}
    return {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """Returns one cycle of ``graph`` as ``[a, b, ..., a]`` (depth-first search), or [] if none."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        path.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return []

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return []


def test_modules_import_one_way():
    """The library, the trainer and the benchmarks: a cycle within or across them fails."""
    cycle = import_cycle(import_graph("tfapprox", "trainer", "benchmarks"))
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_import_cycle_is_found(tmp_path):
    """The checks themselves: a function-local import that closes a circle is one."""
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": set(), "p": {"p.a"}}
    assert import_cycle(graph) == []
    assert import_cycle({**graph, "p.c": {"p.a"}}) == ["p.a", "p.b", "p.c", "p.a"]
    source = tmp_path / "m.py"
    source.write_text("import p.c\nfrom p import a, x\n\ndef f():\n    from p.b import g\n")
    assert imported_modules(source, set(graph)) == {"p", "p.a", "p.b", "p.c"}
