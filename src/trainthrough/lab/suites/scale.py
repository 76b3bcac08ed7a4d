"""The scale suite: goodput and time to train of every data-parallel strategy at 8 to
100,000 accelerators, from a discrete-event model whose decisions are the runtime's
own policy objects (lab/scale/). No engine runs: the suite is evaluated by the model.

``--quick``: 3 sizes (8, 1,024, 100,000), 20,000 steps, 1 seed (the full form: 5 sizes,
100,000 steps, 3 seeds). Every parameter is an ``--option key=value``
(lab/scale/params.py; docs/scale-suite.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trainthrough.lab.suite import SuiteSpec

DESCRIPTION = ("data parallel at 8 to 100,000 accelerators: goodput of every strategy and "
               "checkpoint-restart's variants, a model driven by the real policies")


def build(quick: bool = False, seeds: int | None = None,
          options: dict[str, str] | None = None) -> SuiteSpec:
    """The suite for ``quick``/``seeds`` and the user's ``options``.

    Raises:
        UserError: an unknown option or a bad value (checked here, before anything runs).
    """
    from trainthrough.lab.scale.params import QUICK_SIZES, ScaleParams, parse

    base = replace(ScaleParams(), sizes=QUICK_SIZES, steps=20_000) if quick else ScaleParams()
    params = parse(options or {}, base)
    n_seeds = seeds or (1 if quick else 3)

    def evaluate(out: Path, quiet: bool) -> str:
        from trainthrough.lab.scale.report import write

        return write(params, n_seeds, out, quiet)

    return SuiteSpec(name="scale", title="Scale suite", runs=[], evaluate=evaluate,
                     notes=[f"{n_seeds} seed(s); parameters: " + ", ".join(
                         f"{k}={v}" for k, v in params.rows())])
