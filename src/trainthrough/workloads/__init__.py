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

import importlib
from collections.abc import Callable
from typing import Any

from trainthrough.errors import UserError
from trainthrough.workloads.base import Evaluation, OptimizerSpec, Params, Workload

# name -> ("module:Class", one-line description). Modules import lazily so that
# `trainthrough list` stays fast and a broken optional loader hurts nobody else.
WORKLOADS: dict[str, tuple[str, str]] = {
    "mlr": ("trainthrough.workloads.mlr:MLR",
            "multinomial logistic regression, mini-batch SGD, sklearn digits"),
    "mf": ("trainthrough.workloads.mf:MF",
           "matrix factorization by alternating least squares, synthetic low-rank ratings"),
    "lda": ("trainthrough.workloads.lda:LDA",
            "LDA by collapsed Gibbs sampling, synthetic corpus from a known topic model"),
    "ridge": ("trainthrough.workloads.ridge:Ridge",
              "ridge regression, full-batch GD, isotropic design (SCAR's bound holds exactly)"),
    "cnn": ("trainthrough.workloads.cnn:CNN",
            "2 conv + 2 fully connected layers with Adam, sklearn digits (or IDX files)"),
}

_CUSTOM: dict[str, Callable[..., Workload]] = {}


def register(name: str, factory: Callable[..., Workload], description: str = "") -> None:
    """Make ``factory(seed=..., **options)`` available as workload ``name``."""
    _CUSTOM[name] = factory
    WORKLOADS.setdefault(name, ("", description or f"user workload {name}"))


def workload_factory(name: str) -> Callable[..., Workload]:
    """The class or function that builds workload ``name`` (its parameters are the options).

    Raises:
        UserError: unknown name.
    """
    from trainthrough.workloads import reference

    if name in _CUSTOM:
        return _CUSTOM[name]
    if reference.is_reference(name) or (name not in WORKLOADS and name in reference.installed()):
        return reference.load(name)
    if name not in WORKLOADS:
        raise UserError(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}, "
                        "or give your own as path/to/file.py:factory or "
                        "package.module:factory")
    module, cls = WORKLOADS[name][0].split(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def make_workload(name: str, seed: int = 0, **options: Any) -> Workload:
    """Build workload ``name``.

    Raises:
        UserError: unknown name, unknown option, an option of the wrong type or out of
            range (see :mod:`trainthrough.workloads.options`), or data it cannot use.
    """
    from trainthrough.workloads.options import check_options
    from trainthrough.workloads.user_loop import LoopWorkload, TrainingLoop

    factory = workload_factory(name)
    if isinstance(factory, TrainingLoop):  # a user's own loop (trainthrough.loop)
        if options:
            raise UserError(f"workload {name} is a training loop: it takes no workload options")
        return LoopWorkload(name, factory)
    check_options(name, options)
    try:
        return factory(seed=seed, **options)
    except TypeError as e:  # a user factory's own signature problem, e.g. no seed=
        raise UserError(f"workload {name}: {e}") from None


__all__ = ["Evaluation", "OptimizerSpec", "Params", "Workload", "WORKLOADS",
           "make_workload", "register", "workload_factory"]
