"""Every shell command in README.md runs as written, in order, from a fresh clone.

The clone is a copy of the tracked files with ``.venv`` linked to this checkout's (what
``make setup`` leaves), so ``.venv/bin/trainthrough`` resolves; nothing else is set up,
and no command gets a limit the README does not show: a command too slow for the test
suite is made short in the README itself. Which lines count as commands, and how a
command says it exits other than 0, is in tests/doc_commands.py. A command that fails
here means the README (or the code) is wrong, not this test.

Not run here: ``make run`` and ``make test``. ``make test`` is what CI runs (.ci/run),
so CI exercises it, setup included; ``make run`` is that same setup followed by the full
core suite (about 3 minutes), whose quick form the README's ``compare --suite core
--quick`` runs below. A command written exactly as in an example's docstring (the
``examples/my_model.py`` ones) is run by tests/test_examples.py instead, once.

The commands run one at a time, in README order, in one clone (``runs/demo`` from the
first is re-run by a later one), each starting its own Ray, gloo ranks or ZooKeeper
server when it needs one. Commands on real processes (Ray, gloo) are the long ones
(15-45 s each on an idle 2-core machine), marked ``timeout(300)``; together the
commands take about two minutes there, mostly Ray starting its processes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_commands import (
    ROOT,
    Command,
    docstring_commands,
    explain,
    fresh_clone,
    markdown_commands,
    run,
)
from tests.zk import require_zookeeper

SKIPPED = {"make run", "make test"}  # see the module docstring
IN_EXAMPLES = {c.text for p in (ROOT / "examples").glob("*.py") for c in docstring_commands(p)}
COMMANDS = [c for c in markdown_commands(ROOT / "README.md")
            if c.text.split("#")[0].strip() not in SKIPPED and c.text not in IN_EXAMPLES]
_REAL = re.compile(r"--engine (ray|gloo|dist)\b")


def _param(c: Command) -> object:
    long = bool(_REAL.search(c.text))
    return pytest.param(c, id=c.id, marks=[pytest.mark.timeout(300 if long else 120)])


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to copy")
    return fresh_clone(tmp_path_factory.mktemp("clone"))


def test_the_readme_has_the_commands_this_test_expects() -> None:
    """The extraction itself: the skipped make lines are there, and so are the
    commands later sections rely on (a broken fence would silently drop them)."""
    texts = [c.text for c in markdown_commands(ROOT / "README.md")]
    assert any(t.startswith("make run") for t in texts)
    assert any("--out runs/demo" in t for t in texts)
    assert any("trainthrough.coord" in t and "--engine ray" in t for t in texts)
    assert not any(t.endswith("\\") for t in texts)


def _needs_zookeeper(command: Command) -> None:
    require_zookeeper(f"line {command.line}")


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_readme_command(command: Command, clone: Path) -> None:
    if "trainthrough.coord" in command.text:
        _needs_zookeeper(command)
    r = run(command, clone, timeout=280)
    assert r.returncode == command.exit_code, explain(command, r)
    # The kills a command injects are its own events, not Ray's "a worker died ... the
    # OOM killer" paragraph (engines/ray/runtime.py filters those it made).
    assert "A worker died" not in r.stdout + r.stderr, explain(command, r)
    if command.output:
        # What the README shows is what the terminal shows (stdout and stderr), but for
        # wall-clock seconds, which vary run to run; sim runs are otherwise exact.
        def norm(text: str) -> str:
            return " ".join(re.sub(r"wall=\S+", "wall=*", text).split())

        shown = norm(" ".join(command.output))
        assert shown in norm(r.stdout) or shown in norm(r.stderr), explain(command, r)
