"""Workloads by name: the built-in ones, those :func:`register` adds in this process,
and references to a user's own (:mod:`trainthrough.workloads.reference`). A module of
its own so that :mod:`trainthrough.workloads.options` can look a workload's factory up
without importing the package that imports it."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from trainthrough.errors import UserError
from trainthrough.workloads.base import Workload

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
    from trainthrough.workloads import reference  # entry points: read only when asked

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
