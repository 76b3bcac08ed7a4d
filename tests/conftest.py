"""Shared fixtures: run the CLI in-process and capture what a user would see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainthrough.cli import main


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
