"""Shared fixtures: run the CLI in-process and capture what a user would see."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.zk import require_zookeeper
from trainthrough.cli import main
from trainthrough.coord.zkserver import ZooKeeperServer


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


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole test session (starting one costs ~3 s)."""
    from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray

    started = ensure_ray()
    yield
    if started:
        shutdown_ray()
