"""The package's modules import each other without a circle, lazy (function-level) imports
counted: each module stands on the ones below it. ``callbacks/`` never reads the package's
``__init__`` (the version lives in the leaf ``_version``), and no module imports ``report/``'s
``__init__`` from inside ``report/`` (its modules import each other directly)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "lightning_triage"
Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = SRC) -> str:
    parts = ("lightning_triage", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules that ``source`` (module ``name``) imports anywhere: at the top, in
    a function, under ``TYPE_CHECKING``; ``from a import b`` counts ``a.b`` when it is a module,
    else ``a``. The parents a submodule's import runs implicitly are not counted."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    found.add(sub)
                elif base in modules:
                    found.add(base)
    found.discard(name)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> Graph:
    """``{module: modules it imports}`` for ``{module: (source, is_package)}``."""
    modules = set(sources)
    return {name: imports_of(text, name, pkg, modules) for name, (text, pkg) in sources.items()}


@functools.cache  # parsed once for the tests below
def package_graph() -> Graph:
    return import_graph({module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
                         for p in sorted(SRC.rglob("*.py"))})


def circles(graph: Graph) -> list[list[str]]:
    """Each import circle of ``graph`` once, as the path that closes it (depth-first search)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found


def test_the_package_has_no_import_circle() -> None:
    graph = package_graph()
    assert len(graph) > 50 and "lightning_triage.report.text" in graph
    assert circles(graph) == []


def test_a_lazy_import_closing_a_circle_is_seen() -> None:
    sources = {
        "lightning_triage.report": ("from lightning_triage.report.files import write\n", True),
        "lightning_triage.report.files": (
            "def write():\n    from lightning_triage.report.html import render\n", False),
        "lightning_triage.report.html": ("from lightning_triage.report import lead\n", False),
    }
    graph = import_graph(sources)
    assert graph["lightning_triage.report.files"] == {"lightning_triage.report.html"}
    assert circles(graph) == [["lightning_triage.report", "lightning_triage.report.files",
                               "lightning_triage.report.html", "lightning_triage.report"]]


def test_callbacks_never_import_the_package_init() -> None:
    graph = package_graph()
    bad = sorted(name for name, deps in graph.items()
                 if name.startswith("lightning_triage.callbacks") and "lightning_triage" in deps)
    assert bad == []


def test_report_modules_import_each_other_directly() -> None:
    """A module of ``report/`` that read the package's ``__init__`` (which re-exports them all)
    would be one step from a circle."""
    graph = package_graph()
    bad = sorted(name for name, deps in graph.items()
                 if name.startswith("lightning_triage.report.") and "lightning_triage.report" in deps)
    assert bad == []


def test_findings_sit_below_the_ranking_and_the_report() -> None:
    graph = package_graph()
    assert not graph["lightning_triage.findings"] & {"lightning_triage.ranking",
                                                    "lightning_triage.report"}
