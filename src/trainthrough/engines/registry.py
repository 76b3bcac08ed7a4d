"""The engines, by name: what each claims and how to build it.

Declarations live with each engine (``engines/<name>/__init__.py``: ``DESCRIPTION``,
``CAPABILITIES``, ``ENGINE``, and where it differs from the default its ``TRAITS``);
importing them imports neither Ray nor torch.distributed,
so validation and ``trainthrough list --engines`` stay cheap. Adding an engine means
adding its package and one line here, nothing in ``ft/``, the config or the runner.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trainthrough.engines.capabilities import Capabilities, Traits, unmet
from trainthrough.engines.options import unused_engine_settings, unused_mechanism_settings
from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec
from trainthrough.ft.strategy import Strategy

_PACKAGES = {"sim": "trainthrough.engines.sim", "ray": "trainthrough.engines.ray",
             "gloo": "trainthrough.engines.gloo"}
ALIASES = {"dist": "gloo"}  # the gloo engine's first name; kept so old commands run


@dataclass(frozen=True)
class EngineEntry:
    name: str
    description: str
    capabilities: dict[str, Capabilities]  # paradigm -> claims
    factory: str | dict[str, str]  # "module:Class" (or one per paradigm), imported only to run
    traits: Traits = Traits()

    def factory_for(self, paradigm: str) -> str:
        """The engine class that runs ``paradigm`` (``module:Class``)."""
        return self.factory if isinstance(self.factory, str) else self.factory[paradigm]


def _module(name: str) -> ModuleType:
    return importlib.import_module(_PACKAGES[name])


def canonical(name: str) -> str:
    """The engine's name with aliases resolved (unknown names pass through)."""
    return ALIASES.get(name, name)


def names() -> list[str]:
    return list(_PACKAGES)


def entry(name: str) -> EngineEntry:
    """The declaration of engine ``name`` (aliases accepted).

    Raises:
        UserError: unknown engine.
    """
    name = canonical(name)
    if name not in _PACKAGES:
        raise UserError(f"unknown engine {name!r}; choose one of: {', '.join(_PACKAGES)}")
    m = _module(name)
    return EngineEntry(name, m.DESCRIPTION, m.CAPABILITIES, m.ENGINE,
                       getattr(m, "TRAITS", Traits()))


def traits(name: str) -> Traits:
    """How engine ``name`` runs (:class:`Traits`; aliases accepted).

    Raises:
        UserError: unknown engine.
    """
    return entry(name).traits


def check_supported(engine: str, paradigm: str, consistency: str, strategy: Strategy,
                    specs: list[FailureSpec]) -> None:
    """Refuse a run the engine does not claim, naming the engines that do.

    Raises:
        UserError: one line: what is not supported, and where it is.
    """
    e = entry(engine)
    others = [entry(n) for n in names() if n != e.name]
    if paradigm not in e.capabilities:
        can = [o.name for o in others if paradigm in o.capabilities]
        flag = "--paradigm " + " or ".join(e.capabilities)
        raise UserError(f"the {e.name} engine runs {flag} training, not --paradigm {paradigm}"
                        f"{_where(can, f'--paradigm {paradigm}')}")
    missing = _unmet(e, paradigm, consistency, strategy, specs)
    if not missing:
        return
    what, value = missing[0]
    can = [o.name for o in others if paradigm in o.capabilities
           and not _unmet(o, paradigm, consistency, strategy, specs)]
    shown = f"{what} {value!r}" if value else f"{what} between steps"
    raise UserError(f"the {e.name} engine does not support {shown} for --paradigm {paradigm} "
                    f"(strategy {strategy.name}){_where(can, 'this run')}")


def check_settings(engine: str, paradigm: str, consistency: str, strategy: Strategy,
                   changed: Mapping[str, Any]) -> None:
    """Refuse a setting the run would not read (``changed``: the fields away from their
    defaults), naming what reads it (engines/options.py).

    Raises:
        UserError: one line: the first such setting and where it applies.
    """
    from trainthrough.config import flag_label

    e = entry(engine)
    unread = unused_engine_settings(e.capabilities[paradigm].options, changed)
    if unread:
        k = unread[0]
        can = [n for n in names() if (c := entry(n).capabilities.get(paradigm))
               and k in c.options]
        verb = "reads" if len(can) == 1 else "read"
        where = (f"; only {' and '.join(can)} {verb} it for --paradigm {paradigm}" if can
                 else f"; it does not apply to --paradigm {paradigm}")
        raise UserError(f"{flag_label(k)} is not used by the {e.name} engine{where}: "
                        "drop it")
    idle = unused_mechanism_settings(consistency, strategy, changed)
    if idle:
        k, why = idle[0]
        raise UserError(f"{flag_label(k)} has no effect with strategy {strategy.name} "
                        f"and --consistency {consistency} ({why}): drop it")


def check_resumable(engine: str, paradigm: str, strategy: Strategy) -> None:
    """Refuse ``--resume`` of a run its engine cannot start from a checkpoint.

    Raises:
        UserError: one line: the engine does not claim ``resume`` for the paradigm
            (naming the engines that do), or the strategy keeps no checkpoints.
    """
    e = entry(engine)
    c = e.capabilities.get(paradigm)
    if c is None or not c.resume:
        can = [n for n in names() if (o := entry(n).capabilities.get(paradigm)) and o.resume]
        where = f"; only {' and '.join(can)} can" if can else ""
        raise UserError(f"--resume: the {e.name} engine cannot resume a --paradigm {paradigm} "
                        f"run from its checkpoint{where}; add --overwrite to run it again")
    if strategy.checkpoint == "none":
        raise UserError(f"--resume: strategy {strategy.name} keeps no checkpoints, so there "
                        "is nothing to resume from; add --overwrite to run it again")


def _unmet(e: EngineEntry, paradigm: str, consistency: str, strategy: Strategy,
           specs: list[FailureSpec]) -> list[tuple[str, str]]:
    """Single values the engine does not claim, then combinations it refuses."""
    out = unmet(e.capabilities[paradigm], consistency, strategy, specs)
    refuse = getattr(_module(e.name), "refuse", None)
    if not out and refuse is not None:
        out = [(f"{what} (with --consistency {consistency})", value)
               for what, value in refuse(consistency, strategy)]
    return out


def _where(can: list[str], what: str) -> str:
    if not can:
        return "; no engine supports that"
    return f"; {' or '.join(can)} can run {what} (--engine {can[0]})"


def claims(engine: str, paradigm: str, strategy: Strategy,
           specs: list[FailureSpec] | None = None) -> str | None:
    """The consistency modes under which ``engine`` claims this run ("bsp/async"), or
    None if under none."""
    e = entry(engine)
    c = e.capabilities.get(paradigm)
    if c is None:
        return None
    modes = [m for m in ("bsp", "ssp", "async") if m in c.consistency
             and not _unmet(e, paradigm, m, strategy, specs or [])]
    return "/".join(modes) or None
