"""Rework: what a run's failures cost it in iterations, against its failure-free twin.

:func:`~trainthrough.lab.runner.run_baseline` runs the twin and returns a
:class:`Baseline`; :func:`rework` compares a run's result with it. The bound is SCAR's
(lab/bound.py, docs/bound.md), evaluated on the run's recorded perturbations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainthrough.engines.result import Rework, RunResult

if TYPE_CHECKING:  # bound.py imports torch; a suite's report reads this without it
    from trainthrough.lab.bound import Contraction


@dataclass(frozen=True)
class Baseline:
    """A failure-free twin: its iterations to target (None: it did not reach it) and
    the contraction fitted on its iterates (None: too few in the fitting window)."""

    iterations_to_target: int | None
    fit: Contraction | None = None


def rework(result: RunResult, baseline: Baseline | None) -> Rework:
    """The run's :class:`~trainthrough.engines.result.Rework` against ``baseline``.

    Rework is only defined when both runs reached the target; otherwise it is None and
    ``converged`` says which one did not. The bound needs the fitted contraction.
    """
    if baseline is None:
        return Rework()
    base, fit = baseline.iterations_to_target, baseline.fit
    bound = None if fit is None else fit.bound(
        [(r.at_iteration, r.perturbation_norm) for r in result.recoveries])
    it = result.iterations_to_target
    return Rework(baseline_iterations_to_target=base,
                  rework_iterations=it - base if it is not None and base is not None else None,
                  rework_bound=bound, contraction=fit.c if fit is not None else None)
