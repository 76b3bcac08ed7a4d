"""Each example's docstring commands run as written, in order, from a fresh clone.

An example is read top to bottom by a newcomer and names the exact commands that run
it (indented ``.venv/bin/...`` lines of its module docstring; tests/doc_commands.py).
Here every one of them runs in a copy of the tracked files, and exits 0; commands on
Ray or gloo start their own cluster, one at a time (timeout 300 s: 15-30 s each on
2 cores).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from tests.doc_commands import ROOT, Command, docstring_commands, explain, fresh_clone, run

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
CASES = [(path, c) for path in EXAMPLES for c in docstring_commands(path)]
_REAL = re.compile(r"--engine (ray|gloo|dist)\b")


# Session-scoped: under xdist a worker interleaves other modules' tests with these, and
# a module-scoped clone would be torn down and made afresh between two commands.
@pytest.fixture(scope="session")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to copy")
    return fresh_clone(tmp_path_factory.mktemp("clone"))


def test_the_model_example_documents_sim_ray_and_compare() -> None:
    texts = [c.text for c in docstring_commands(ROOT / "examples" / "my_model.py")]
    assert any("--fail" in t and "--engine" not in t for t in texts)  # sim
    assert any("--fail" in t and "--engine ray" in t for t in texts)
    assert any("compare --suite examples/my_model.py:suite" in t for t in texts)


def _real(path: Path, command: Command) -> bool:
    """Whether the command starts real processes: it names a real engine, or it runs an
    example that does so by default (``byo_loop.py`` starts a local Ray unless told)."""
    return bool(_REAL.search(command.text)) or (
        command.text.split()[0].endswith("python") and "launch(" in path.read_text())


@pytest.mark.parametrize("path,command", [
    pytest.param(p, c, id=f"{p.stem}-{c.id}",
                 marks=[pytest.mark.timeout(300 if _real(p, c) else 120)])
    for p, c in CASES])
def test_example_command(path: Path, command: Command, clone: Path) -> None:
    r = run(command, clone, timeout=280)
    assert r.returncode == command.exit_code, f"{path.name} " + explain(command, r)
    if path.name == "byo_loop.py":
        # A rank SIGKILLed and recovered costs at most half a point of accuracy.
        m = re.search(r"without failures ([\d.]+), with rank 1 killed ([\d.]+)", r.stdout)
        assert m, r.stdout
        assert abs(float(m[1]) - float(m[2])) <= 0.005, m[0]
        assert "1 failure(s)" in r.stdout and "mini-batch-rollback of rank1" in r.stdout
    if "compare --suite examples/my_model.py:suite" in command.text:
        # The comparison names the model and has a number for every strategy.
        folder = clone / re.search(r"csv: (\S+)results\.csv", r.stdout).group(1)  # type: ignore[union-attr]
        rows = list(csv.DictReader((folder / "results.csv").read_text().splitlines()))
        assert {row["workload"] for row in rows} == {"my-model"}
        assert {row["strategy"] for row in rows} == {"none", "checkpoint-restart",
                                                     "scar-partial", "scar"}
        assert all(row["failures"] == "1" and float(row["iterations_to_target"]) > 0
                   and row["rework_iterations"] != "" for row in rows), rows
        assert "my-model" in (folder / "report.md").read_text()


@pytest.mark.parametrize("name", ["mnist_port.py", "char_gpt.py"])
def test_a_port_states_the_lines_it_added_or_changed(name: str) -> None:
    """The count in the docstring is the count of marked lines, and stays near 12."""
    text = (ROOT / "examples" / name).read_text()
    stated = re.search(r"\*\*(\d+) lines added or changed\*\*", text)
    assert stated, f"{name} does not state its lines added or changed"
    marked = [line for line in text.splitlines() if re.search(r"  # [+~]( |$)", line)]
    assert len(marked) == int(stated[1]) <= 13, (name, len(marked))
    assert "from trainthrough.loop import" in "\n".join(marked)
