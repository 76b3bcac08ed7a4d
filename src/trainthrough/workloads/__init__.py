"""Workloads: iterative-convergent algorithms written as additive updates.

``make_workload(name, seed, **options)`` builds one by name; ``WORKLOADS`` lists them
with a one-line description. Give your own by reference (``path/to/file.py:factory``,
``package.module:factory`` or an installed entry point: see
:mod:`trainthrough.workloads.reference`), which every process of a run (Ray actors,
gloo ranks) imports itself; :func:`register` names one for this process only.
``trainthrough.workloads.custom`` wraps any PyTorch model, and
``trainthrough.workloads.user_loop`` is a user's own training loop seen as a workload.

The workloads sit low in the layers (``pyproject.toml``'s import contract): of
trainthrough they may import only the config, :mod:`trainthrough.fields` (today they need
nothing else) and :mod:`trainthrough.errors`; never an engine, a strategy, a failure spec
or :mod:`trainthrough.loop`.
"""

from __future__ import annotations

from typing import Any

from trainthrough.errors import UserError
from trainthrough.workloads.base import Evaluation, OptimizerSpec, Params, Workload
from trainthrough.workloads.names import WORKLOADS, register, workload_factory


def make_workload(name: str, seed: int = 0, **options: Any) -> Workload:
    """Build workload ``name``.

    Raises:
        UserError: unknown name, unknown option, an option of the wrong type or out of
            range (see :mod:`trainthrough.workloads.options`), or data it cannot use.
    """
    from trainthrough.workloads.options import check_options
    from trainthrough.workloads.user_loop import LoopWorkload, TrainingLoop

    factory = workload_factory(name)
    check_options(name, options)
    if isinstance(factory, TrainingLoop):  # a user's own loop (trainthrough.loop)
        return LoopWorkload(name, factory)  # its options go to train() in every rank
    try:
        return factory(seed=seed, **options)
    except TypeError as e:  # a user factory's own signature problem, e.g. no seed=
        raise UserError(f"workload {name}: {e}") from None


__all__ = ["Evaluation", "OptimizerSpec", "Params", "Workload", "WORKLOADS",
           "make_workload", "register", "workload_factory"]
