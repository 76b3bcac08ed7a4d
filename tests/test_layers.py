"""The layers hold: no import points upward (the contract in ``pyproject.toml``, checked
by import-linter on the source these tests import), and the bottom layers load without
torch."""

from __future__ import annotations

import os
import subprocess
import sys
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
