"""Strategies are compositions of small mechanisms (docs/architecture.md).

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
from trainthrough.ft.recovery import (
    FromWorkerCopies,
    RecoveryPolicy,
    Reinitialize,
    RestoreLost,
    RollbackAll,
)


@dataclass(frozen=True)
class Strategy:
    """One fault-tolerance strategy.

    ``checkpoint``: ``none``, ``full`` or ``prioritized``; ``persist``: ``sync`` or ``async``;
    ``recovery``: ``reinit``, ``rollback-all``, ``restore-lost`` or ``worker-copy`` (lost
    rows from the parameters live workers last pulled; parameter server),
    ``failover`` (promote a chain replica), ``mini-batch-rollback`` or ``lossy-forward``
    (data parallel; ``rollback-all`` is checkpoint-restart in both); ``replication``:
    ``none``, ``chain-sync`` or ``chain-async``; ``outage`` (what workers do while a
    shard is down): ``wait`` or ``buffer``; ``sync`` (data parallel: how often replicas
    synchronize): ``every-step`` (a gradient allreduce each step), ``localsgd``,
    ``diloco`` or ``streaming-diloco`` (every ``sync_every`` inner steps, dp/relaxed.py),
    which go with ``recovery=drop-local``. :attr:`paradigms` says where the strategy
    applies; which engines run it is for the engines to declare (engines/registry.py).
    """

    name: str
    description: str
    checkpoint: str = "none"
    persist: str = "sync"
    recovery: str = "reinit"
    replication: str = "none"
    outage: str = "wait"
    sync: str = "every-step"

    @property
    def relaxed(self) -> bool:
        """Replicas synchronize every ``sync_every`` inner steps, not every step."""
        return self.sync != "every-step"

    def checkpoint_policy(self, every: int, fraction: float | None = None,
                          rule: str = "largest-change") -> CheckpointPolicy:
        """The saving policy; ``fraction`` and ``rule`` apply to ``prioritized`` only.

        ``fraction=None`` means ``1/every``: a full checkpoint's bytes spread evenly,
        a slice every iteration.
        """
        asynchronous = self.persist == "async"
        if self.checkpoint == "none":
            return NoCheckpoints()
        if self.checkpoint == "prioritized":
            return PrioritizedEvery(every, fraction or 1.0 / every, rule, asynchronous)
        return FullEvery(every, asynchronous=asynchronous)

    @property
    def paradigms(self) -> tuple[str, ...]:
        """``ps`` and/or ``dp``: the training paradigms this composition makes sense in.

        A data-parallel rank holds a full replica, so there are no rows to restore
        partially or reinitialize, and prioritized (row-wise) saves do not apply.
        """
        if self.recovery in _DP_ONLY:
            return ("dp",)
        if self.recovery != "rollback-all" or self.checkpoint == "prioritized":
            return ("ps",)
        return ("ps", "dp")

    def require(self, paradigm: str) -> None:
        """Raise if this strategy does not apply to ``paradigm``.

        Raises:
            UserError: naming the paradigm to use instead, or the strategies that fit.
        """
        if paradigm in self.paradigms:
            return
        fits = [n for n, p in PRESETS.items() if paradigm in p.paradigms]
        other = "data-parallel (--paradigm dp)" if paradigm == "ps" else \
            "parameter-server (--paradigm ps)"
        raise UserError(f"strategy {self.name!r} is for {other} training; for --paradigm "
                        f"{paradigm} choose one of: {', '.join(fits)}")

    def recovery_policy(self) -> RecoveryPolicy:
        """The parameter-server recovery policy (data parallel: ft/dp_policies.py)."""
        self.require("ps")
        policies: dict[str, type[RecoveryPolicy]] = {
            "reinit": Reinitialize, "rollback-all": RollbackAll,
            "restore-lost": RestoreLost, "failover": RestoreLost,
            "worker-copy": FromWorkerCopies}
        return policies[self.recovery]()


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
                 "every r*N; r=0.25 by default) + partial recovery", checkpoint="prioritized",
                 recovery="restore-lost"),
        Strategy("worker-copy",
                 "lost shard rows from the freshest copy live workers pulled (bsp: one "
                 "round old, then that round replayed from the pushes the workers kept, "
                 "unless one of them died too; ssp/async: up to the staleness old); a full "
                 "checkpoint every N supplies optimizer state and the rows no live worker "
                 "holds; nothing rolls back",
                 checkpoint="full", recovery="worker-copy"),
        Strategy("checkpoint-sync",
                 "TTF: full checkpoint every N, training blocked while it is written; a "
                 "lost shard restarts from it", checkpoint="full", recovery="restore-lost"),
        Strategy("checkpoint-async",
                 "TTF: snapshot in memory, persist in the background; a lost shard "
                 "restarts from the last complete one", checkpoint="full", persist="async",
                 recovery="restore-lost"),
        Strategy("chain-sync",
                 "TTF: chain of R replicas per shard, a push acknowledged once the tail "
                 "applied it, reads from the tail; failover promotes a replica",
                 recovery="failover", replication="chain-sync"),
        Strategy("chain-async",
                 "TTF: chain of R replicas, the head acknowledges at once and forwards in "
                 "the background with bounded lag", recovery="failover",
                 replication="chain-async"),
        Strategy("stateless",
                 "TTF: while a shard is down workers keep computing on the weights they "
                 "hold and buffer updates; the restarted shard (from its checkpoint) "
                 "applies the backlog", checkpoint="full", persist="async",
                 recovery="restore-lost", outage="buffer"),
        Strategy("rollback",
                 "data parallel: immediate mini-batch rollback; survivors undo the partial "
                 "step and redo that mini-batch, no checkpoint read",
                 recovery="mini-batch-rollback"),
        Strategy("lossy-forward",
                 "data parallel: keep what was applied, drop the failed ranks' share of "
                 "the step, carry on with the survivors", recovery="lossy-forward"),
        Strategy("localsgd",
                 "data parallel, relaxed: each replica takes sync_every local steps, then "
                 "the parameters are averaged; a lost replica's local steps are dropped, "
                 "nobody rolls back", recovery="drop-local", sync="localsgd"),
        Strategy("diloco",
                 "data parallel, relaxed (DiLoCo): every sync_every inner steps the "
                 "pseudo-gradient (global - local) is averaged and applied by an outer "
                 "Nesterov SGD; a lost replica's inner steps are dropped, nobody rolls back",
                 recovery="drop-local", sync="diloco"),
        Strategy("streaming-diloco",
                 "DiLoCo with the model in sync_fragments fragments, each with its own "
                 "outer step on a staggered schedule", recovery="drop-local",
                 sync="streaming-diloco"),
    ]
}

_DP_ONLY = ("mini-batch-rollback", "lossy-forward", "drop-local")
SYNCS = ("every-step", "localsgd", "diloco", "streaming-diloco")
_CHOICES = {"checkpoint": ("none", "full", "prioritized"), "persist": ("sync", "async"),
            "recovery": ("reinit", "rollback-all", "restore-lost", "failover", "worker-copy",
                         *_DP_ONLY),
            "replication": ("none", "chain-sync", "chain-async"), "outage": ("wait", "buffer"),
            "sync": SYNCS}


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
    seen: set[str] = set()
    for part in text.split(","):
        key, _, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if key in seen:
            raise UserError(f"strategy: {key} is given twice in {text!r}")
        seen.add(key)
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
    out = replace(base, name=text, description="custom composition", **fields)  # type: ignore[arg-type]
    if out.relaxed != (out.recovery == "drop-local"):
        raise UserError("strategy: a relaxed sync (sync=localsgd, diloco or streaming-diloco) "
                        "goes with recovery=drop-local, and drop-local with a relaxed sync")
    if out.relaxed and out.checkpoint != "none":
        raise UserError("strategy: a relaxed sync recovers from the survivors' replicas, "
                        "without checkpoints: drop checkpoint=")
    if (out.recovery == "failover") != (out.replication != "none"):
        raise UserError("strategy: recovery=failover goes with a chain replication "
                        "(replication=chain-sync or chain-async), and a chain with failover")
    return out
