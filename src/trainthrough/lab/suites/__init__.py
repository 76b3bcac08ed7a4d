"""Named experiment suites: each is code that returns a SuiteSpec."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainthrough.lab.suite import SuiteSpec
from trainthrough.lab.suites import core, dataparallel, scar, ttf


@dataclass(frozen=True)
class SuiteDef:
    """A suite's one-line description and its builder ``build(quick, seeds)``."""

    description: str
    build: Callable[..., SuiteSpec]


SUITES: dict[str, SuiteDef] = {
    "core": SuiteDef(core.DESCRIPTION, core.build),
    "scar": SuiteDef(scar.DESCRIPTION, scar.build),
    "ttf": SuiteDef(ttf.DESCRIPTION, ttf.build),
    "dataparallel": SuiteDef(dataparallel.DESCRIPTION, dataparallel.build),
}
