"""The house's shape: no import circle in memstep/ or ui/, the library never reaches up into
the app, and the command line lives in one place. Read from the source with ``ast`` (nothing
is imported), so a circle that Python happens to resolve at run time still fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memstep", "ui")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules that ``path`` imports, anywhere in the file (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_submodule_imports_are_resolved(tmp_path):
    known = {"memstep.cli", "memstep.cli.common", "memstep.errors"}
    source = tmp_path / "__init__.py"
    source.write_text("from . import common\nfrom memstep.errors import MemstepError\n")
    assert _imports(source, "memstep.cli", known) == {"memstep.cli.common", "memstep.errors"}


# the evaluation's figures, written as files by `memstep eval` (the app draws them too)
PLOT_MODULES = {"memstep/evaluation/plots.py", "memstep/evaluation/niah_view.py"}


def test_the_library_never_imports_the_app():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("memstep"):
            assert not [t for t in targets if t.startswith("ui")], name
    for path in (ROOT / "memstep").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module and not node.level}
        assert "gradio" not in names, path
        # plotly only where the evaluation writes its figures to files
        assert "plotly" not in names or path.relative_to(ROOT).as_posix() in PLOT_MODULES, path


@pytest.mark.parametrize("old", ["cli.py", "plan_cli.py", "eval_cli.py", "compress_cli.py",
                                 "compress/laco_cli.py", "compress/sparse_cli.py", "planner.py"])
def test_the_command_line_and_planner_live_in_their_folders(old):
    assert not (ROOT / "memstep" / old).exists()
    verbs = {p.stem for p in (ROOT / "memstep" / "cli").glob("*.py")} | {"compress"}
    assert {"run", "schedule", "plan", "eval", "compress", "common"} <= verbs
