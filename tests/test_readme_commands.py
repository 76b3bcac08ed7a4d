"""Every shell command in README.md and docs/*.md runs as written, in order, from a fresh clone.

The clone is a copy of the tracked files with ``.venv`` linked to this checkout's (what
``make setup`` leaves), so ``.venv/bin/trainthrough`` resolves; nothing else is set up,
and no command gets a limit the documentation does not show: a command too slow for the
test suite is made short in the documentation itself. Which lines count as commands, and
how a command says it exits other than 0, is in tests/doc_commands.py. A command that
fails here means the documentation (or the code) is wrong, not this test.

Not run here: ``make run`` and ``make test``. ``make test`` is what CI runs (.ci/run),
so CI exercises it, setup included; ``make run`` is that same setup followed by the full
core suite (about 3 minutes), whose quick form the README's ``compare --suite core
--quick`` runs below. A command written exactly as in an example's docstring (the
``examples/my_model.py`` ones) is run by tests/test_examples.py instead, once.

Commands run in a clone per xdist worker. Those that name the same run folder form a
chain that runs in order on one worker (``runs/demo`` from the first is re-run by a
later one; ``runs/long`` is stopped, resumed, started over); every other command is
independent of the rest and may run on any worker, beside the others
(tests/conftest.py). A command that needs another's output must name its folder. Each command starts its own
Ray, gloo ranks or ZooKeeper server when it needs one. Commands on real processes (Ray,
gloo) are the long ones (15-45 s each on an idle 2-core machine), marked
``timeout(300)``; together the commands take a few minutes there, mostly Ray starting
its processes.
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
#: Where commands are read, in the order they run: the README, then docs/ by file name.
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = [(source, c) for source in SOURCES for c in markdown_commands(source)
            if c.text.split("#")[0].strip() not in SKIPPED and c.text not in IN_EXAMPLES]
_REAL = re.compile(r"--engine (ray|gloo|dist)\b")


def _param(source: Path, c: Command) -> object:
    long = bool(_REAL.search(c.text))
    prefix = "" if source.name == "README.md" else f"{source.stem}-"
    return pytest.param(source, c, id=prefix + c.id,
                        marks=[pytest.mark.timeout(300 if long else 240)])


# Session-scoped: under xdist a worker interleaves other modules' tests with these, and
# a module-scoped clone would be torn down and made afresh between two commands.
@pytest.fixture(scope="session")
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


def test_the_docs_commands_are_found_too() -> None:
    """docs/*.md pages are read with the same rules: a command moved there from the
    README is still run (a broken fence would silently drop it)."""
    docs = [c.text for s in SOURCES[1:] for c in markdown_commands(s)]
    assert any("--strategy worker-copy" in t for t in docs)
    assert not any(t.endswith("\\") for t in docs)
    assert [s.name for s in SOURCES][0] == "README.md"


def _needs_zookeeper(command: Command) -> None:
    require_zookeeper(f"line {command.line}")


@pytest.mark.parametrize("source,command", [_param(s, c) for s, c in COMMANDS])
def test_readme_command(source: Path, command: Command, clone: Path) -> None:
    if "trainthrough.coord" in command.text:
        _needs_zookeeper(command)
    r = run(command, clone, timeout=280)
    where = f"{source.relative_to(ROOT)} "
    assert r.returncode == command.exit_code, where + explain(command, r)
    # The kills a command injects are its own events, not Ray's "a worker died ... the
    # OOM killer" paragraph (engines/ray/runtime.py filters those it made).
    assert "A worker died" not in r.stdout + r.stderr, where + explain(command, r)
    if command.output:
        # What the README shows is what the terminal shows (stdout and stderr), but for
        # wall-clock seconds, which vary run to run; sim runs are otherwise exact.
        def norm(text: str) -> str:
            return " ".join(re.sub(r"wall=\S+", "wall=*", text).split())

        shown = norm(" ".join(command.output))
        assert shown in norm(r.stdout) or shown in norm(r.stderr), where + explain(command, r)
