"""The layers hold: no import points upward (the contract in ``pyproject.toml``, checked
by import-linter on the source these tests import), and the bottom layers load without
torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trainthrough

ROOT = Path(__file__).resolve().parents[1]
# The folder holding the trainthrough these tests import: the subprocesses check that one.
SRC = str(Path(trainthrough.__file__).resolve().parents[1])


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def test_no_import_points_up_a_layer() -> None:
    """``lint-imports`` (its Python API, in a fresh interpreter: it puts the working
    folder on ``sys.path``): any back edge, even an import inside a function, fails."""
    p = _python("import sys\nfrom importlinter.cli import lint_imports\n"
                f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, "
                "no_cache=True, no_logo=True))")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 kept, 0 broken" in p.stdout, p.stdout


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
