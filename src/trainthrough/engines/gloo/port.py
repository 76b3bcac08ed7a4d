"""What the ``dist`` controller's helpers may use of it: :class:`ControllerPort`.

:class:`~.recovery.DistRecovery` (membership and recovery) and
:class:`~.evals.ControllerEvals` (scoring) act on the run through this narrow interface
rather than on :class:`~.controller.GlooEngine` itself, so each can be driven without
processes (tests/test_gloo_protocol.py hands the recovery a stand-in). Call order, as
the controller makes it: it sets up :attr:`~ControllerPort.store` and
:attr:`~ControllerPort.procs` before building either helper; then every tick it drains
the ranks' messages (:meth:`~ControllerPort.pump`, which routes some to the helpers) and
lets the recovery advance; the helpers call back into :meth:`~ControllerPort.pump`
(to read a message that may have arrived within the tick), :meth:`~ControllerPort.emit`
and :meth:`~ControllerPort.evaluate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch.distributed as dist

    from trainthrough.config import RunConfig
    from trainthrough.engines.base import RunContext
    from trainthrough.engines.gloo.checkpoints import ControllerSaves
    from trainthrough.engines.gloo.messages import Metrics
    from trainthrough.engines.gloo.procs import Procs
    from trainthrough.engines.result import RunResult
    from trainthrough.events import Event
    from trainthrough.ft.strategy import Strategy
    from trainthrough.workloads.base import Evaluation


class ControllerPort(Protocol):
    """The controller as its recovery and its evaluations see it."""

    # -- the run's settings, read only
    @property
    def cfg(self) -> RunConfig: ...

    @property
    def strategy(self) -> Strategy: ...

    @property
    def ctx(self) -> RunContext:
        """Scoring, look-back copies and evaluation bookkeeping (evaluations only)."""
        ...

    # -- what the controller owns and the helpers act on
    @property
    def store(self) -> dist.Store:
        """The run's store: plans, reports, control requests (protocol.py)."""
        ...

    @property
    def procs(self) -> Procs:
        """The rank processes: spawn, kill, ready, alive, ended."""
        ...

    @property
    def saves(self) -> ControllerSaves:
        """The run's checkpoints: how many, and the one a restart loads."""
        ...

    @property
    def result(self) -> RunResult:
        """Counters the helpers add to (updates applied and lost, recoveries)."""
        ...

    # -- how far the ranks said the run got
    @property
    def iteration(self) -> int: ...

    @property
    def logical(self) -> int: ...

    @property
    def stopping(self) -> bool:
        """The controller asked the group to stop: no replacement is taken in."""
        ...

    @property
    def group_size(self) -> int:
        """How many ranks are in the group now (an evaluation records it)."""
        ...

    # -- calls back
    def pump(self) -> bool:
        """Handle every message the ranks posted so far; whether there were any."""
        ...

    def emit(self, event: Event) -> None:
        """Record an event of the run."""
        ...

    def evaluate(self, m: Metrics, scored: Evaluation, look_back: bool = False) -> None:
        """Record the first member's evaluation ``m``; stop at the target."""
        ...
