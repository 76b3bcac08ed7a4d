"""Experiment suites: each is code that returns a SuiteSpec.

The named ones live here; a suite of your own is given by reference, like a workload
(``--suite path/to/file.py:function`` or ``package.module:function``), and is called as
``function(quick=..., seeds=...)``. A suite that takes options (``--option key=value``:
the scale suite) gets them as ``options``; the others refuse any. Its runs may name workloads by reference too:
``examples/my_model.py`` has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainthrough.errors import UserError
from trainthrough.lab.suite import SuiteSpec
from trainthrough.lab.suites import core, dataparallel, relaxed, scale, scar, stragglers, ttf


@dataclass(frozen=True)
class SuiteDef:
    """A suite's one-line description and its builder ``build(quick, seeds)`` (and
    ``options``, if it ``takes_options``)."""

    description: str
    build: Callable[..., SuiteSpec]
    takes_options: bool = False


SUITES: dict[str, SuiteDef] = {
    "core": SuiteDef(core.DESCRIPTION, core.build),
    "scar": SuiteDef(scar.DESCRIPTION, scar.build),
    "ttf": SuiteDef(ttf.DESCRIPTION, ttf.build),
    "dataparallel": SuiteDef(dataparallel.DESCRIPTION, dataparallel.build),
    "relaxed": SuiteDef(relaxed.DESCRIPTION, relaxed.build),
    "scale": SuiteDef(scale.DESCRIPTION, scale.build, takes_options=True),
    "stragglers": SuiteDef(stragglers.DESCRIPTION, stragglers.build),
}


def build_suite(name: str, quick: bool = False, seeds: int | None = None,
                options: dict[str, str] | None = None) -> SuiteSpec:
    """The suite ``name`` (a named suite or a reference), built for ``quick``/``seeds``
    and ``options`` (``key -> text``, for a suite that takes them).

    Raises:
        UserError: an unknown name, options for a suite that takes none, a reference that
            does not resolve, or a function that does not return a SuiteSpec with at
            least one run (or a model to evaluate).
    """
    from trainthrough.workloads.reference import is_reference, load_reference

    if options and not (name in SUITES and SUITES[name].takes_options):
        takes = [k for k, d in SUITES.items() if d.takes_options]
        raise UserError(f"suite {name!r} takes no --option; suites that do: {', '.join(takes)}")
    if name in SUITES:
        d = SUITES[name]
        if d.takes_options:
            return d.build(quick=quick, seeds=seeds, options=options or {})
        return d.build(quick=quick, seeds=seeds)
    if not is_reference(name):
        raise UserError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}, or "
                        "give your own as path/to/file.py:function")
    spec = load_reference(name, "suite")(quick=quick, seeds=seeds)
    if not isinstance(spec, SuiteSpec) or not (spec.runs or spec.evaluate is not None):
        raise UserError(f"suite {name!r} must return a SuiteSpec with at least one run "
                        f"(got {type(spec).__name__})")
    return spec
