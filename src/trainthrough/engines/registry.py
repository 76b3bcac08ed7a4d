"""The engines, by name: what each claims and how to build it.

Declarations live with each engine (``engines/<name>/__init__.py``: ``DESCRIPTION``,
``CAPABILITIES``, ``ENGINE``); importing them imports neither Ray nor torch.distributed,
so validation and ``trainthrough list --engines`` stay cheap. Adding an engine means
adding its package and one line here, nothing in ``ft/``, the config or the runner.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from trainthrough.engines.capabilities import Capabilities, unmet
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
    factory: str  # "module:Class", imported only to run


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
    return EngineEntry(name, m.DESCRIPTION, m.CAPABILITIES, m.ENGINE)


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


def matrix_lines() -> list[str]:
    """The capability matrix as text: every preset and failure form per engine."""
    from trainthrough.faults.spec import parse
    from trainthrough.ft.strategy import PRESETS

    engines = names()
    head = f"  {'strategy / failure form':<34}{'paradigm':<10}" + "".join(
        f"{n:<11}" for n in engines)
    lines = ["capability matrix (what each engine claims; tests/conformance runs every "
             "claimed cell and checks every refused one):", head]
    for name, strategy in PRESETS.items():
        for paradigm in strategy.paradigms:
            cells = [claims(n, paradigm, strategy) for n in engines]
            lines.append(f"  {name:<34}{paradigm:<10}" + "".join(
                f"{(c or '-'):<11}" for c in cells))
    forms = {"ps": ["shards=0@iter=5", "shards=0@time=1s", "shard=any@mtbf=2s,max=2",
                    "worker=0@iter=5", "shards=0@iter=5,replica=1",
                    "shards=0@iter=5,phase=recovery"],
             "dp": ["rank=0@iter=5", "rank=0@iter=5,phase=forward",
                    "rank=0@iter=5,phase=allreduce:1", "rank=0@iter=5,phase=update",
                    "rank=0@iter=5,phase=recovery", "rank=0@iter=5,mode=hang"]}
    base = {"ps": PRESETS["chain-sync"], "dp": PRESETS["rollback"]}
    for paradigm, texts in forms.items():
        for text in texts:
            specs = parse([text])
            cells = []
            for n in engines:
                c = entry(n).capabilities.get(paradigm)
                ok = c is not None and not [m for m in unmet(c, "", base[paradigm], specs)
                                            if m[0].startswith("failure")]
                cells.append("yes" if ok else "-")
            lines.append(f"  {text:<34}{paradigm:<10}" + "".join(f"{c:<11}" for c in cells))
    return lines
