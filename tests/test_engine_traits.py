"""What the layers above the engines ask about an engine (``Traits``), and that they
ask the registry rather than compare the engine's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines import registry
from trainthrough.engines.capabilities import Traits
from trainthrough.errors import UserError
from trainthrough.lab.validate import validate_run

SRC = Path(__file__).resolve().parents[1] / "src" / "trainthrough"
# Modules above the registry that once branched on an engine's name.
ASKERS = ["lab/validate.py", "lab/runner.py", "lab/suite.py", "lab/advise/advisor.py",
          "lab/advise/calibrate.py", "lab/advise/check.py"]


def test_each_engine_declares_how_it_runs() -> None:
    assert registry.traits("sim") == Traits(virtual_clock=True, hosts_processes=False)
    assert registry.traits("ray") == Traits(on_ray=True)
    assert registry.traits("gloo") == Traits()  # processes, wall clock, no Ray
    assert registry.traits("dist") == registry.traits("gloo")  # the alias
    with pytest.raises(UserError, match="unknown engine"):
        registry.traits("nope")


@pytest.mark.parametrize("path", ASKERS)
def test_no_branch_on_an_engine_name_above_the_registry(path: str) -> None:
    """A comparison with, or a table keyed by, an engine's name: ask ``traits`` instead."""
    names = {*registry.names(), *registry.ALIASES}
    tree = ast.parse((SRC / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            parts += [e for p in parts if isinstance(p, (ast.Tuple, ast.Set, ast.List))
                      for e in p.elts]
        elif isinstance(node, ast.Dict):
            parts = [k for k in node.keys if k is not None]
        else:
            continue
        named = [p.value for p in parts if isinstance(p, ast.Constant) and p.value in names]
        assert not named, f"{path}:{node.lineno} compares with {named}"


def test_a_users_loop_is_refused_where_no_process_hosts_it(tmp_path: Path) -> None:
    loop = tmp_path / "my_loop.py"
    loop.write_text("from trainthrough.loop import training_loop\n\n"
                    "@training_loop\ndef train(ctx):\n    pass\n")
    cfg = RunConfig(workload=f"{loop}:train", paradigm="dp", engine="sim")
    with pytest.raises(UserError, match="--engine ray or gloo"):
        validate_run(cfg)
