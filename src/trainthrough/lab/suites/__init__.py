"""Experiment suites: each is code that returns a SuiteSpec.

The named ones live here; a suite of your own is given by reference, like a workload
(``--suite path/to/file.py:function`` or ``package.module:function``), and is called as
``function(quick=..., seeds=...)``. Its runs may name workloads by reference too:
``examples/my_model.py`` has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainthrough.errors import UserError
from trainthrough.lab.suite import SuiteSpec
from trainthrough.lab.suites import core, dataparallel, relaxed, scar, ttf


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
    "relaxed": SuiteDef(relaxed.DESCRIPTION, relaxed.build),
}


def build_suite(name: str, quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    """The suite ``name`` (a named suite or a reference), built for ``quick``/``seeds``.

    Raises:
        UserError: an unknown name, a reference that does not resolve, or a function
            that does not return a SuiteSpec with at least one run.
    """
    from trainthrough.workloads.reference import is_reference, load_reference

    if name in SUITES:
        return SUITES[name].build(quick=quick, seeds=seeds)
    if not is_reference(name):
        raise UserError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}, or "
                        "give your own as path/to/file.py:function")
    spec = load_reference(name, "suite")(quick=quick, seeds=seeds)
    if not isinstance(spec, SuiteSpec) or not spec.runs:
        raise UserError(f"suite {name!r} must return a SuiteSpec with at least one run "
                        f"(got {type(spec).__name__})")
    return spec
