"""Failure injection for the ``gloo`` engine: orders resolved by the controller, carried
out by the rank itself at the named point.

The controller resolves the failure specs once (the same seeded
:class:`~trainthrough.faults.schedule.FailureSchedule` as ``sim``, so ``any``, ``N%``
and ``mtbf`` pick the same ids) into one :class:`Order` per victim, and hands each
rank process the orders of its slot. The shared step calls :meth:`Injector.at` at
every injection point it names (:data:`trainthrough.dp.step.POINTS`) and, when an
order is due, posts a ``failure`` event and then SIGKILLs itself (``mode=crash``) or
SIGSTOPs itself (``mode=hang``; ``mode=pause``: the controller continues it with SIGCONT
after the pause, through the handle it pinned when it started the process, and the rank
then says it is ``awake`` and goes on: if the group fenced it meanwhile, that and all it
writes after are refused, and the next plan tells it it is out), or gives itself its
preemption notice, a SIGTERM (``mode=preempt:<notice>``, :mod:`.notice`): it then goes on
to leave at a step boundary, and the controller SIGKILLs it if it has not left when the
notice is over. Self-delivery is what puts a failure exactly after ``K`` buckets: a
signal from another process would land wherever the rank happens to be. ``mode=slow:F``
strikes nothing: from its trigger on, the rank sleeps ``F - 1`` times what each step's
gradients took it to compute, before the step's collectives (its peers wait for it
there). The controller only ever SIGKILLs ranks whose heartbeat stopped, ranks whose
notice ran out and ranks left over at the end, always by the PID it started.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch.distributed as dist

from trainthrough.dp.step import check_points
from trainthrough.engines.gloo import CAPABILITIES
from trainthrough.engines.signals import strike_self
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.faults.spec import FailureSpec


@dataclass(frozen=True)
class Order:
    """Slot ``slot`` fails at the first ``phase`` point at or after its trigger."""

    slot: int
    at_iter: int | None
    at_time: float | None
    phase: str  # "boundary" for specs without a phase
    mode: str
    spec: str
    pause_seconds: float | None = None
    slow_factor: float | None = None
    notice: float | None = None  # mode=preempt: seconds from the SIGTERM to the SIGKILL


def check_specs(specs: list[FailureSpec], buckets: int | None) -> None:
    """Reject what the gloo engine cannot deliver (the shared check, with its phases;
    ``buckets`` None: the bucket count is not known before the ranks start).

    Raises:
        UserError: naming the spec and what to use instead.
    """
    check_points(specs, buckets, CAPABILITIES["dp"].phases, "gloo")


def resolve_orders(sched: FailureSchedule) -> list[Order]:
    """Every failure of the run's schedule as per-slot orders, in trigger order."""
    return [Order(i, e.at_iter, e.at_time, e.phase or "boundary", e.mode, e.spec,
                  e.pause_seconds, e.slow_factor, e.notice)
            for e in sched.pending for i in e.ids]


def order_dicts(orders: list[Order]) -> list[dict[str, object]]:
    return [asdict(o) for o in orders]


class Injector:
    """A rank's pending orders, delivered at the step's injection points.

    ``logical`` reads the rank's logical iteration, which the failure event reports
    (the controller needs it when no survivor is left to say how far the run got);
    ``local_steps``, what it adds (relaxed sync: the local steps the rank takes along;
    None otherwise).
    """

    def __init__(self, orders: list[dict[str, object]], store: dist.Store, t0: float,
                 logical: Callable[[], int],
                 local_steps: Callable[[], int | None] = lambda: None) -> None:
        self.orders = [Order(**o) for o in orders]  # type: ignore[arg-type]
        self.store, self.t0, self.logical, self.local_steps = store, t0, logical, local_steps
        self.slow: float | None = None  # mode=slow: each step takes this many times its compute
        self._began: float | None = None  # when this step's compute began (mode=slow)

    async def at(self, point: str, step: int) -> None:
        """Fail now if an order for ``point`` is due (a crash or hang: this call then
        never returns; a pause: it returns once the process is continued; a preemption:
        the rank goes on with its notice); then a slow rank's sleep, if ``point`` ends
        the step's compute."""
        phase = "allreduce" if point.startswith("allreduce:") else point
        now = time.time() - self.t0
        for o in list(self.orders):
            due = ((o.at_iter is not None and step >= o.at_iter)
                   or (o.at_time is not None and now >= o.at_time))
            if due and o.phase == point:
                self._strike(o, phase, step, self.logical())
        self._pace(point)

    def _strike(self, o: Order, phase: str, executed: int, logical: int) -> None:
        from trainthrough.engines.gloo.messages import Awake, Failed
        from trainthrough.engines.gloo.protocol import post

        # Posted before it strikes, so the controller knows what failed, where and when
        # (and, for a pause, when to continue it).
        post(self.store, Failed(kind="rank", ids=[o.slot], spec=o.spec, phase=o.phase,
                                phase_kind=phase, mode=o.mode, iteration=executed,
                                logical=logical, pid=os.getpid(),
                                local_steps=self.local_steps(), pause_seconds=o.pause_seconds))
        self.orders.remove(o)  # spent: a pause, a slow-down or a notice goes on living
        if o.mode == "slow":
            self.slow = o.slow_factor
            return
        if o.mode == "preempt":
            from trainthrough.engines.gloo.notice import RankNotice

            notice = RankNotice.current
            if notice is None:  # the engine declares preempt only where ranks take notices
                raise RuntimeError("a preemption order in a rank that takes no notices")
            assert o.notice is not None  # the spec parser requires one
            notice.preempt(o.spec, o.notice)
            return
        stopped = time.time()
        strike_self(signal.SIGKILL if o.mode == "crash" else signal.SIGSTOP)
        if o.mode == "pause":  # continued by the controller: say so (refused if fenced)
            post(self.store, Awake(spec=o.spec, paused_seconds=round(time.time() - stopped, 3)))
            return
        # A hung rank resumes here only if someone sends SIGCONT; it must not go on.
        os._exit(3)

    def _pace(self, point: str) -> None:
        """A slow rank: the compute of a step is timed from its ``boundary`` to the end of
        its gradients (``backward``; ``inner`` for a relaxed sync's inner step), then
        slept ``slow - 1`` times over, before any collective of the step."""
        if self.slow is None:
            return
        if point == "boundary":
            self._began = time.monotonic()
        elif point in ("backward", "inner") and self._began is not None:
            time.sleep((self.slow - 1.0) * (time.monotonic() - self._began))
            self._began = None
