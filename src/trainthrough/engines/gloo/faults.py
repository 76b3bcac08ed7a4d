"""Failure injection for the ``dist`` engine: orders resolved by the controller, carried
out by the rank itself at the named point.

The controller resolves the failure specs once (the same seeded
:class:`~trainthrough.faults.schedule.FailureSchedule` as ``sim``, so ``any``, ``N%``
and ``mtbf`` pick the same ids) into one :class:`Order` per victim, and hands each
rank process the orders of its slot. The rank checks them at every injection point
(``boundary``, ``forward``, ``backward``, ``allreduce:K``, ``update``) and, when one
is due, posts a ``failure`` event and then SIGKILLs itself (``mode=crash``) or
SIGSTOPs itself (``mode=hang``). Self-delivery is what puts a failure exactly after
``K`` buckets: a signal from another process would land wherever the rank happens
to be. The controller only ever SIGKILLs ranks it has found hung (after detection)
and ranks left over at the end, always by the PID it started.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass

import torch.distributed as dist

from trainthrough.errors import UserError
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.faults.spec import FailureSpec

PHASES_DIST = ("forward", "backward", "update")


@dataclass(frozen=True)
class Order:
    """Slot ``slot`` fails at the first ``phase`` point at or after its trigger."""

    slot: int
    at_iter: int | None
    at_time: float | None
    phase: str  # "boundary" for specs without a phase
    mode: str
    spec: str


def check_specs(specs: list[FailureSpec], buckets: int) -> None:
    """Reject what the ``dist`` engine cannot deliver.

    Raises:
        UserError: naming the spec and what to use instead.
    """
    for s in specs:
        p = s.phase
        if p is None or p in PHASES_DIST:
            continue
        if p.startswith("allreduce:"):
            if int(p[10:]) >= buckets:
                raise UserError(f"failure spec {s.text!r}: the allreduce has {buckets} buckets, "
                                f"so K in allreduce:K goes from 0 to {buckets - 1}")
            continue
        raise UserError(f"failure spec {s.text!r}: phase {p} is not available on the dist "
                        "engine; use forward, backward, allreduce:K or update (or --engine sim)")


def resolve_orders(sched: FailureSchedule) -> list[Order]:
    """Every failure of the run's schedule as per-slot orders, in trigger order."""
    return [Order(i, e.at_iter, e.at_time, e.phase or "boundary", e.mode, e.spec)
            for e in sched.pending for i in e.ids]


def order_dicts(orders: list[Order]) -> list[dict[str, object]]:
    return [asdict(o) for o in orders]


class Injector:
    """A rank's pending orders; :meth:`strike` is called at every injection point."""

    def __init__(self, orders: list[dict[str, object]], store: dist.Store, t0: float) -> None:
        self.orders = [Order(**o) for o in orders]  # type: ignore[arg-type]
        self.store, self.t0 = store, t0

    def strike(self, point: str, executed: int, logical: int) -> None:
        """Fail now if an order for ``point`` is due (this call then never returns)."""
        phase = "allreduce" if point.startswith("allreduce:") else point
        now = time.time() - self.t0
        for o in self.orders:
            due = ((o.at_iter is not None and executed >= o.at_iter)
                   or (o.at_time is not None and now >= o.at_time))
            if due and o.phase == point:
                self._die(o, phase, executed, logical)

    def _die(self, o: Order, phase: str, executed: int, logical: int) -> None:
        from trainthrough.engines.gloo.protocol import post

        # Posted before dying, so the controller knows what failed, where and when.
        post(self.store, {"type": "failure", "kind": "rank", "ids": [o.slot], "spec": o.spec,
                          "phase": o.phase, "phase_kind": phase, "mode": o.mode,
                          "iteration": executed, "logical": logical, "pid": os.getpid()})
        os.kill(os.getpid(), signal.SIGKILL if o.mode == "crash" else signal.SIGSTOP)
        # A stopped rank resumes here only if someone sends SIGCONT; it must not go on.
        os._exit(3)
