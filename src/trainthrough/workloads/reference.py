"""Workloads given by reference: a user's own code, found the same way in every process.

Three forms, accepted wherever a workload name is (``--workload``, TOML, suites):

- ``path/to/file.py:factory``: a file anywhere (relative paths are made absolute when
  the run is resolved, so Ray actors and gloo ranks, whose working directory differs,
  import the same file);
- ``package.module:factory``: an importable module;
- an installed package's entry point in the group ``trainthrough.workloads``
  (``trainthrough list`` shows them by name).

``factory(seed=..., **options)`` returns a :class:`~trainthrough.workloads.base.Workload`
(e.g. a :class:`~trainthrough.workloads.custom.TorchWorkload`). Every process that needs
the workload (the driver, each actor, each rank) imports it by the reference itself:
nothing is pickled.

``trainthrough compare --suite`` takes a suite by reference the same way
(:func:`load_reference`; see ``lab/suites/__init__.py``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from trainthrough.errors import UserError

GROUP = "trainthrough.workloads"


def is_reference(name: str) -> bool:
    return ":" in name


def installed() -> dict[str, str]:
    """Entry points of installed packages: workload name -> ``module:factory``."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def absolute(name: str) -> str:
    """``file.py:factory`` with the file made absolute (other forms unchanged)."""
    where, _, attr = name.rpartition(":")
    if where.endswith(".py"):
        return f"{Path(where).expanduser().resolve()}:{attr}"
    return name


def load(name: str) -> Callable[..., Any]:
    """The factory a reference (or an installed entry point's name) points to.

    Raises:
        UserError: the file or module is missing, fails to import (its first line), or
            has no such callable.
    """
    if not is_reference(name):
        target = installed().get(name)
        if target is None:
            raise UserError(f"unknown workload {name!r}")
        name = target
    return load_reference(name, "workload")


def load_reference(name: str, what: str) -> Callable[..., Any]:
    """The callable ``path/to/file.py:attr`` or ``package.module:attr`` names; ``what``
    (``workload``, ``suite``) names it in errors. Workloads and suites both resolve here.

    Raises:
        UserError: a malformed reference; the file or module is missing, fails to import
            (its first line), or has no such callable.
    """
    where, _, attr = name.rpartition(":")
    dotted = all(part.isidentifier() for part in where.split("."))
    if not where or not attr.isidentifier() or not (where.endswith(".py") or dotted):
        raise UserError(f"{what} reference {name!r} must be path/to/file.py:function or "
                        "package.module:function")
    module = _file(where, what) if where.endswith(".py") else _module(where, what)
    found = getattr(module, attr, None)
    if not callable(found):
        raise UserError(f"{what} reference {name!r}: {where} has no callable {attr!r}")
    return found  # type: ignore[no-any-return]


def _file(path: str, what: str) -> Any:
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise UserError(f"{what} file {path} does not exist")
    # One module per file, named after its path, imported once per process.
    name = f"trainthrough_user_{hashlib.sha1(str(p).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise UserError(f"{what} file {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise UserError(f"{what} file {path} failed to import: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        ) from None
    return module


def _module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise UserError(f"{what} module {name} cannot be imported: {e}") from None
    except Exception as e:
        raise UserError(f"{what} module {name} failed to import: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from None
