"""Which strategies the advisor weighs: every preset that fits the run, once each.

Candidates come from :data:`~trainthrough.ft.strategy.PRESETS`, kept if the preset
applies to the paradigm and the chosen engine claims it under the run's consistency
(engines/registry.py), so a preset added later is weighed without a change here.
Presets that compose the same mechanisms (``scar-partial`` and ``checkpoint-sync``
are both full checkpoints + restore the lost shards) would be calibrated and
predicted identically: the first is weighed and the others are named as its aliases.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec
from trainthrough.ft.strategy import PRESETS, Strategy


@dataclass(frozen=True)
class Candidate:
    """One strategy to weigh, and the presets that are the same composition."""

    strategy: Strategy
    aliases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.strategy.name

    @property
    def checkpoints(self) -> bool:
        return self.strategy.checkpoint != "none"

    @property
    def label(self) -> str:
        return self.name + (f" (= {', '.join(self.aliases)})" if self.aliases else "")


def _mechanisms(s: Strategy) -> tuple[str, ...]:
    return (s.checkpoint, s.persist, s.recovery, s.replication, s.outage, s.sync)


def candidates(engine: str, paradigm: str, consistency: str, specs: list[FailureSpec],
               only: list[str] | None = None) -> list[Candidate]:
    """The presets to weigh for this run, in :data:`PRESETS` order.

    Args:
        only: restrict to these preset names (``--strategies``); each must be a preset
            that fits the run.

    Raises:
        UserError: an unknown name in ``only``, a name that does not fit the run, or
            no candidate at all.
    """
    from trainthrough.engines.registry import claims

    fits = [s for s in PRESETS.values() if paradigm in s.paradigms
            and consistency in (claims(engine, paradigm, s, specs) or "").split("/")]
    if only is not None:
        names = {s.name for s in fits}
        for n in only:
            if n not in PRESETS:
                raise UserError(f"--strategies: unknown preset {n!r}; choose from: "
                                f"{', '.join(sorted(names))}")
            if n not in names:
                raise UserError(f"--strategies: {n} does not run here (--engine {engine}, "
                                f"--paradigm {paradigm}, --consistency {consistency}); "
                                f"choose from: {', '.join(s.name for s in fits)}")
        fits = [s for s in fits if s.name in only]
    out: dict[tuple[str, ...], Candidate] = {}
    for s in fits:
        key = _mechanisms(s)
        if key in out:
            c = out[key]
            out[key] = Candidate(c.strategy, (*c.aliases, s.name))
        else:
            out[key] = Candidate(s)
    if not out:
        raise UserError(f"no strategy preset runs on --engine {engine} with --paradigm "
                        f"{paradigm} and --consistency {consistency}")
    return list(out.values())
