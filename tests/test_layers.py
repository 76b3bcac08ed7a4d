"""The layers hold: no import points upward (the contract in ``pyproject.toml``, checked
by import-linter on the source these tests import), and the bottom layers load without
torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import trainthrough

ROOT = Path(__file__).resolve().parents[1]
# The folder holding the trainthrough these tests import: the subprocesses check that one.
SRC = str(Path(trainthrough.__file__).resolve().parents[1])


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (nothing imported yet) on that trainthrough."""
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def test_no_import_points_up_a_layer(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``lint-imports`` through its Python API, in this process (it finds the package
    these tests import): any back edge, even an import inside a function, fails."""
    from importlinter.cli import lint_imports

    monkeypatch.setattr(sys, "path", list(sys.path))  # it puts the working folder first
    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                        no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 kept, 0 broken" in out, out


def test_the_config_loads_without_torch() -> None:
    """The config, its fields and the errors are the bottom layers: anything may read a
    config (a CLI parser, a report) without paying for torch."""
    p = _python("import sys\nimport trainthrough.config, trainthrough.fields\n"
                "assert 'torch' not in sys.modules, 'torch was imported'\n"
                "print(' '.join(sorted(m for m in sys.modules if m.startswith('trainthrough'))))")
    assert p.returncode == 0, p.stderr
    # Nothing of trainthrough above the config comes along either.
    assert p.stdout.split() == ["trainthrough", "trainthrough.config", "trainthrough.errors",
                                "trainthrough.fields"], p.stdout


def _module_imports() -> dict[str, set[str]]:
    """Every trainthrough module -> the trainthrough modules it imports, at module level
    or inside a function (a function-level import hides a circle from import-linter's
    layers but not from a reader). Imports under ``if TYPE_CHECKING:`` are left out: they
    name a type for the checker and never run."""
    src = Path(SRC)
    files: dict[str, tuple[Path, bool]] = {}
    for p in (src / "trainthrough").rglob("*.py"):
        parts = list(p.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if package else parts)] = (p, package)

    def typing_only(node: ast.AST) -> bool:
        test = getattr(node, "test", None)
        return isinstance(node, ast.If) and (
            (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))

    def walk(node: ast.AST) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(node):
            if not typing_only(child):
                yield child
                yield from walk(child)

    graph: dict[str, set[str]] = {}
    for name, (path, package) in files.items():
        here = name if package else name.rpartition(".")[0]
        out: set[str] = set()
        for node in walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, less one level per extra dot
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for a in node.names:  # `from pkg import module` imports the module
                    full = f"{base}.{a.name}"
                    out.add(full if full in files else base)
        graph[name] = {m for m in out if m in files and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part: list[str] = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    part.append(w)
                    if w == v:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_two_files_import_each_other() -> None:
    """No circle of imports between files, function-level imports included: a module
    that needs a piece of one above it takes the piece down (or into a module of its
    own), so each file can be read, and tested, after the ones it imports."""
    graph = _module_imports()
    assert "trainthrough.engines.registry" in graph["trainthrough.engines.matrix"]  # sees
    assert _cycles(graph) == [], _cycles(graph)


def test_the_cycle_finder_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
