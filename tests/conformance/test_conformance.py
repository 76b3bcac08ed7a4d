"""Every cell an engine claims runs and keeps the same invariants; every other is refused.

See ``matrix.py`` for the cells and the invariants; ``trainthrough list --engines``
prints the same claims as a table. Every cell on real processes is also watched from
/proc while it runs (tests/sockets.py): each listener it opens, Ray's daemons, the gloo
store and pairs, must be on loopback.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.conformance.matrix import all_cells, check, claimed, config, covering, run_cell
from tests.sockets import Sampler, assert_loopback
from trainthrough.cli import main
from trainthrough.config import RunConfig
from trainthrough.lab.runner import run_silent

CELLS = all_cells()
RUN = covering(CELLS)
REFUSED = [c for c in CELLS if not claimed(c)]


@functools.cache
def full_save_payload(shards: int) -> int:
    """Payload bytes of one full checkpoint of the matrix's mlr (from a sim run)."""
    s = run_silent(RunConfig(workload="mlr", strategy="checkpoint-restart", shards=shards,
                             workers=2, checkpoint_every=10, max_iterations=30,
                             stop_at_target=False))
    return int(s.extras["checkpoint_payload_bytes"] // s.checkpoints)


def test_the_matrix_covers_every_engine_and_refuses_something() -> None:
    engines = {c.engine for c in RUN}
    assert engines == {"sim", "ray", "gloo"}
    assert len(RUN) >= 40 and len(REFUSED) >= 40


@pytest.mark.parametrize("cell", [c for c in RUN if c.engine == "sim"], ids=lambda c: c.id)
def test_sim_cell(cell, tmp_path: Path) -> None:  # noqa: ANN001
    s, events = run_cell(cell, tmp_path)
    check(cell, s, events, full_save_payload(config(cell).shards))


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("cell", [c for c in RUN if c.engine == "ray"], ids=lambda c: c.id)
def test_ray_cell(cell, tmp_path: Path) -> None:  # noqa: ANN001
    pytest.importorskip("ray")
    with Sampler() as sockets:  # every listener of the run, Ray's daemons included
        s, events = run_cell(cell, tmp_path)
    check(cell, s, events, full_save_payload(config(cell).shards))
    assert_loopback(sockets.seen)
    assert len(sockets.seen) >= 3  # GCS, raylet, object manager at least


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell", [c for c in RUN if c.engine == "gloo"], ids=lambda c: c.id)
def test_gloo_cell(cell, tmp_path: Path) -> None:  # noqa: ANN001
    with Sampler() as sockets:  # the controller's store and every rank's gloo pairs
        s, events = run_cell(cell, tmp_path)
    check(cell, s, events, 0)
    assert_loopback(sockets.seen)


@pytest.mark.parametrize("cell", REFUSED, ids=lambda c: c.id)
def test_unclaimed_cell_is_refused(cell, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    cfg = config(cell)
    args = ["run", "--engine", cell.engine, "--paradigm", cell.paradigm,
            "--strategy", cell.strategy, "--out", str(tmp_path / "o"), "--quiet"]
    if cell.paradigm == "ps":
        args += ["--consistency", cfg.consistency]
    for spec in cell.specs():
        args += ["--fail", spec]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert not (tmp_path / "o").exists()
