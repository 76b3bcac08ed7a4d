"""Shared fixtures, and the two tiers of the suite.

The tiers are set here, in one place. A test is **slow** when it starts a process (a
gloo rank, a Ray cluster, a ZooKeeper server, a CLI subprocess) or computes for many
seconds: its module is listed in :data:`SLOW_MODULES` or its name in
:data:`SLOW_TESTS`, it uses a fixture in :data:`PROCESS_FIXTURES`, or its id names a
real engine (:data:`REAL_ENGINE`). ``make check`` (``pytest -m "not slow"``) runs the
rest, the quick tier; ``make test`` runs both. The rule is enforced, not trusted: a
test outside the slow tier that starts a process fails, naming this file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.zk import require_zookeeper
from trainthrough.cli import main
from trainthrough.coord.zkserver import ZooKeeperServer

#: Modules every test of which starts processes.
SLOW_MODULES = {
    "test_chaos", "test_coord", "test_dist", "test_examples", "test_gloo_protocol",
    "test_liveness", "test_loop", "test_loopback", "test_pause", "test_preempt", "test_ray_bsp",
    "test_two_hosts", "test_ray_engine", "test_ray_pool",
    "test_ray_warm", "test_readme_commands", "test_vs_torchft", "test_zk_flapping",
}
#: Single tests elsewhere that start one (a CLI subprocess, a process to signal) or that
#: compute for many seconds (statistical checks over many seeds, whole suites).
SLOW_TESTS = {
    # processes
    "test_a_signal_while_the_fsync_pool_starts_does_not_hang_the_exit",
    "test_real_process_exit_code", "test_the_parser_answers_without_importing_torch",
    "test_sigterm_on_the_command_marks_the_folder", "test_a_run_still_running_is_never_replaced",
    "test_a_reused_pid_is_not_taken_for_the_run",
    "test_digits_are_scikit_learns_without_importing_it", "test_the_config_loads_without_torch",
    # long computations
    "test_mlr_prediction_within_20_percent_of_the_seeded_trace",
    "test_strategies_train_identically_without_failures_so_one_twin_serves_all",
    "test_bound_holds_exactly_on_ridge_for_many_random_perturbations",
    "test_the_report_gives_every_cell_an_interval_and_the_headline",
    "test_compare_runs_a_suite_by_reference_on_a_model_by_reference",
    "test_scar_partial_never_worse_than_checkpoint_restart",
    "test_issue_command_converges_with_rework_and_is_deterministic",
}
#: Modules of documented commands, run in a clone that earlier commands leave runs in.
#: Commands that name the same run folder (``--out runs/demo``, then ``--config
#: runs/demo/config.toml``) form a chain that runs whole, in order, on one xdist
#: worker; every other command is a group of its own, so they spread over the workers.
IN_ORDER = {"test_readme_commands", "test_examples"}
_RUN_FOLDER = re.compile(r"\bruns/([\w.-]+)")
#: Fixtures that start a process (or a whole Ray) for the test that uses them.
PROCESS_FIXTURES = {"ray_session", "zk_server", "clone"}
#: A test id naming an engine that runs real processes (a parameter or the test's name).
REAL_ENGINE = re.compile(r"(?<![a-z])(ray|gloo|dist|zookeeper)(?![a-z])")


def _starts_processes(item: pytest.Item) -> bool:
    module = Path(str(item.fspath)).stem
    name = getattr(item, "originalname", item.name)  # without the parameters' id
    return (module in SLOW_MODULES or name in SLOW_TESTS
            or bool(PROCESS_FIXTURES & set(item.fixturenames))
            or bool(REAL_ENGINE.search(item.name)))


def _chain(item: pytest.Item) -> str:
    """A documented command's chain: its file and the run folder it names, or itself."""
    spec = getattr(item, "callspec", None)
    params = spec.params if spec is not None else {}
    source = params.get("source", params.get("path"))
    text = str(getattr(params.get("command"), "text", ""))
    folder = _RUN_FOLDER.search(text)
    return f"{Path(str(source)).stem}:{folder.group(1) if folder else item.name}"


def _names_still_there(items: list[pytest.Item]) -> None:
    """A renamed test would leave the slow tier silently (and ``make check`` slow): when
    every test module is collected, each name in :data:`SLOW_TESTS` must still exist."""
    modules = {Path(str(item.fspath)).stem for item in items}
    here = {p.stem for p in Path(__file__).parent.rglob("test_*.py")}
    if here - modules:
        return  # a part of the suite: the names elsewhere are not collected
    gone = SLOW_TESTS - {getattr(item, "originalname", item.name) for item in items}
    if gone:
        raise pytest.UsageError(f"tests/conftest.py SLOW_TESTS names no test: {sorted(gone)}")


# tryfirst: xdist reads the groups in its own hook of the same name, on each worker
# (pytest < 9: xdist 3.8 marks a group in the node id, which pytest 9 no longer takes).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _names_still_there(items)
    for item in items:
        if _starts_processes(item):
            item.add_marker(pytest.mark.slow)
        if "ray_session" in item.fixturenames:
            # A worker's Ray serves a whole group: the conformance cells on one, the
            # other Ray tests on another (two Rays, not one per test or per worker).
            cells = Path(str(item.fspath)).parent.name == "conformance"
            item.add_marker(pytest.mark.xdist_group("ray:cells" if cells else "ray"))
        elif (module := Path(str(item.fspath)).stem) in IN_ORDER:  # chains in order
            item.add_marker(pytest.mark.xdist_group(f"{module}:{_chain(item)}"))
        elif module == "test_two_hosts":
            # Each starts a Ray cluster of two nodes: one at a time, beside the two
            # Rays of the groups above (four clusters at once starve them all).
            item.add_marker(pytest.mark.xdist_group(module))


@pytest.fixture(autouse=True)
def _memory_filesystem_as_it_was() -> Iterator[None]:
    """What a test leaves in ``memory://`` goes when it ends. fsspec's in-memory
    filesystem is one per process, and each lookup in it (``info``, ``exists``, ``mv``,
    ``rm``) walks every file and folder it holds: a worker runs hundreds of tests, and
    the store tests alone left 573 folders there for every later test to walk. Tests
    do not share state through it either way."""
    from fsspec.implementations.memory import MemoryFileSystem

    files, folders = set(MemoryFileSystem.store), list(MemoryFileSystem.pseudo_dirs)
    yield
    for path in set(MemoryFileSystem.store) - files:
        MemoryFileSystem.store.pop(path, None)
    MemoryFileSystem.pseudo_dirs[:] = folders


@pytest.fixture(autouse=True)
def _quick_tests_start_no_process(request: pytest.FixtureRequest,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside the slow tier, starting a process fails the test (see the module doc)."""
    if request.node.get_closest_marker("slow"):
        return

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError(f"{request.node.nodeid} starts a process: list it as slow in "
                             "tests/conftest.py (SLOW_MODULES), or keep it in-process")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    """Call ``trainthrough`` with a list of arguments; returns code, stdout, stderr."""

    def _run(*args: str) -> CliResult:
        code = main(list(args))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return _run


def read_summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text())


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """A real standalone ZooKeeper server on a free loopback port, shared by the session.

    Missing ZooKeeper (or kazoo) skips the test locally but fails it under CI: there
    `.ci/run` installs the Debian package and `make` installs kazoo, so a skip would
    hide a broken setup.
    """
    require_zookeeper("the ZooKeeper tests")
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture
def ray_session() -> None:
    """The worker's local Ray (starting one costs ~4.5 CPU s), shared by the tests of
    its group (conftest hook: they run one after another on one worker) and shut down
    after the group's last test (:func:`pytest_runtest_teardown`): an idle Ray's daemons
    burn ~0.04 of a core, for nothing while the worker runs other modules' tests."""
    from trainthrough.engines.ray.runtime import ensure_ray

    if ensure_ray():
        _RAY_STARTED.append(True)


_RAY_STARTED: list[bool] = []  # whether this worker's process started the Ray it holds


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut this worker's Ray down when the next test does not use it (none, or one of
    another group): a later ``ray_session`` test starts one again."""
    if not _RAY_STARTED or "ray_session" not in getattr(item, "fixturenames", ()):
        return
    if nextitem is not None and "ray_session" in getattr(nextitem, "fixturenames", ()):
        return
    from trainthrough.engines.ray.runtime import shutdown_ray

    _RAY_STARTED.clear()
    shutdown_ray()
