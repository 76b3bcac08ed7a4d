"""Strategies are compositions of four small mechanisms (see DESIGN.md).

A :class:`Strategy` names one choice per decision: what is saved and when, what
is replicated, what recovery restores, what workers do while a shard is down.
Presets map to the literature; ``--strategy key=value,...`` builds any other
combination (hybrids are a feature).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainthrough.errors import UserError
from trainthrough.ft.checkpointing import CheckpointPolicy, FullEvery, NoCheckpoints
from trainthrough.ft.prioritized import PrioritizedEvery
from trainthrough.ft.recovery import RecoveryPolicy, Reinitialize, RestoreLost, RollbackAll


@dataclass(frozen=True)
class Strategy:
    """One fault-tolerance strategy.

    ``checkpoint``: ``none``, ``full`` or ``prioritized``; ``persist``: ``sync`` or ``async``;
    ``recovery``: ``reinit``, ``rollback-all`` or ``restore-lost``;
    ``replication`` and ``outage`` are ``none``/``wait`` until the runtime issues.
    """

    name: str
    description: str
    checkpoint: str = "none"
    persist: str = "sync"
    recovery: str = "reinit"
    replication: str = "none"
    outage: str = "wait"

    def checkpoint_policy(self, every: int, fraction: float | None = None,
                          rule: str = "largest-change") -> CheckpointPolicy:
        """The saving policy; ``fraction`` and ``rule`` apply to ``prioritized`` only.

        ``fraction`` defaults to ``1/every``: a full checkpoint's bytes spread evenly,
        a slice every iteration, which keeps the most-changing rows freshest.
        """
        asynchronous = self.persist == "async"
        if self.checkpoint == "none":
            return NoCheckpoints()
        if self.checkpoint == "prioritized":
            return PrioritizedEvery(every, fraction or 1.0 / every, rule, asynchronous)
        return FullEvery(every, asynchronous=asynchronous)

    def recovery_policy(self) -> RecoveryPolicy:
        return {"reinit": Reinitialize, "rollback-all": RollbackAll,
                "restore-lost": RestoreLost}[self.recovery]()


PRESETS: dict[str, Strategy] = {
    s.name: s for s in [
        Strategy("none", "no fault tolerance: a lost shard restarts from initial values"),
        Strategy("checkpoint-restart",
                 "full checkpoint every N; any failure rolls all parameters and the "
                 "iteration back to the last checkpoint", checkpoint="full",
                 recovery="rollback-all"),
        Strategy("scar-partial",
                 "SCAR: full checkpoint every N; only the lost shards are restored, the "
                 "survivors keep their current values", checkpoint="full",
                 recovery="restore-lost"),
        Strategy("scar",
                 "SCAR: prioritized checkpoints (the rows that changed most, a fraction r "
                 "every r*N; r=1/N by default) + partial recovery", checkpoint="prioritized",
                 recovery="restore-lost"),
    ]
}

_CHOICES = {"checkpoint": ("none", "full", "prioritized"), "persist": ("sync", "async"),
            "recovery": ("reinit", "rollback-all", "restore-lost")}


def resolve(text: str) -> Strategy:
    """A preset by name, or a composition ``base=PRESET,key=value,...``.

    Raises:
        UserError: unknown preset, key or value.
    """
    if text in PRESETS:
        return PRESETS[text]
    if "=" not in text:
        raise UserError(f"unknown strategy {text!r}; choose one of: {', '.join(PRESETS)} "
                        "(or compose: 'checkpoint=full,recovery=restore-lost')")
    fields: dict[str, str] = {}
    base = PRESETS["none"]
    for part in text.split(","):
        key, _, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if key == "base":
            if val not in PRESETS:
                raise UserError(f"strategy: unknown base preset {val!r}")
            base = PRESETS[val]
        elif key in _CHOICES:
            if val not in _CHOICES[key]:
                raise UserError(f"strategy: {key} must be one of {', '.join(_CHOICES[key])} "
                                f"(got {val!r})")
            fields[key] = val
        else:
            raise UserError(f"strategy: unknown key {key!r}; use base, "
                            f"{', '.join(_CHOICES)}")
    return replace(base, name=text, description="custom composition", **fields)
