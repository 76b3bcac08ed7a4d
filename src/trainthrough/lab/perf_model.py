"""Predicted runtime overhead of data-parallel recovery strategies.

First-order models in the quantities the ``sim`` cost model charges, so a
prediction can be checked against a simulated run. Overhead is a fraction of the
failure-free runtime: a steady part paid whether or not anything fails, plus the
expected time lost per failure divided by the mean time between failures (MTBF,
of the whole group). Lossy forward recovery also changes the model, which may
cost extra iterations (rework); that is measured, not predicted, here.

- checkpoint-restart: a checkpoint of cost ``C`` every ``T`` seconds (by default
  Young/Daly's ``T = sqrt(2 C MTBF)``); a failure loses half an interval on
  average, plus detection, the restart and reading the checkpoint back:
  ``C/T + (T/2 + D + R + C_read) / MTBF``.
- rollback (immediate mini-batch rollback): detection, re-formation and the part
  of the interrupted step that is redone (half a step on average, one at most),
  plus a copy of the state before every update to be able to undo it.
- lossy-forward: detection and re-formation only.

Both elastic strategies then run on ``N-1`` ranks until a replacement joins
(``replace_seconds``); keeping the global batch makes each step's compute
``N/(N-1)`` times longer meanwhile (:func:`shrink_seconds`), and the join costs
another re-formation plus copying a replica (``join_seconds``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DPCosts:
    """What the models need, in seconds (``ranks`` = 0 ignores the shrunk period)."""

    step_seconds: float  #: one failure-free step: compute + allreduce + update
    checkpoint_seconds: float  #: C, training blocked by one checkpoint
    mtbf_seconds: float  #: mean time between failures of any rank
    detection_seconds: float = 1.0  #: failure to detection (a hang: the timeout)
    reform_seconds: float = 0.5  #: survivors build a new group
    restart_seconds: float = 5.0  #: relaunching every rank
    read_seconds: float | None = None  #: reading a checkpoint back (default: C)
    compute_share: float = 1.0  #: fraction of a step that is compute
    ranks: int = 0  #: N, for the shrunk period of the elastic strategies
    replace_seconds: float = 0.0  #: failure to a replacement joining
    join_seconds: float = 0.0  #: growing back: re-formation + copying a replica (0: never)


@dataclass(frozen=True)
class Overhead:
    """One strategy's predicted overhead."""

    strategy: str
    steady_fraction: float  #: paid without failures (checkpoints)
    per_failure_seconds: float  #: expected seconds lost per failure
    fraction: float  #: steady_fraction + per_failure_seconds / MTBF
    interval_seconds: float | None = None  #: checkpoint period used, if any


def young_daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's first-order optimal checkpoint period ``sqrt(2 C MTBF)``."""
    return math.sqrt(2.0 * checkpoint_seconds * mtbf_seconds)


def shrink_seconds(c: DPCosts) -> float:
    """Extra seconds spent while ``N-1`` ranks carry ``N`` ranks' global batch.

    Over the ``replace_seconds`` before the replacement joins, the compute share of
    each step is ``N/(N-1)`` times longer, i.e. a fraction ``1/N`` of that window's
    compute time is lost. Zero when ``ranks`` < 2 or nothing is replaced.
    """
    if c.ranks < 2 or c.replace_seconds <= 0:
        return 0.0
    return c.replace_seconds * c.compute_share / c.ranks


def checkpoint_restart(c: DPCosts, interval_seconds: float | None = None) -> Overhead:
    """Checkpoint every ``interval_seconds`` (default Young/Daly); restart the group.

    Raises:
        ValueError: a non-positive interval or MTBF.
    """
    if c.mtbf_seconds <= 0:
        raise ValueError("MTBF must be positive")
    t = interval_seconds if interval_seconds is not None else \
        young_daly_interval(c.checkpoint_seconds, c.mtbf_seconds)
    if t <= 0:
        raise ValueError("the checkpoint interval must be positive")
    read = c.checkpoint_seconds if c.read_seconds is None else c.read_seconds
    steady = c.checkpoint_seconds / t
    lost = t / 2 + c.detection_seconds + c.restart_seconds + read
    return Overhead("checkpoint-restart", steady, lost, steady + lost / c.mtbf_seconds, t)


def rollback(c: DPCosts) -> Overhead:
    """Immediate mini-batch rollback: re-form, redo the interrupted step. Nothing is
    paid without failures: the update follows the commit (dp/step.py), so there is
    never an update to undo and no copy of the replica before each one."""
    lost = (c.detection_seconds + c.reform_seconds + c.step_seconds / 2 + shrink_seconds(c)
            + c.join_seconds)
    return Overhead("rollback", 0.0, lost, lost / c.mtbf_seconds)


def lossy_forward(c: DPCosts) -> Overhead:
    """Lossy forward recovery: re-form and carry on (the dropped share is not redone)."""
    lost = c.detection_seconds + c.reform_seconds + shrink_seconds(c) + c.join_seconds
    return Overhead("lossy-forward", 0.0, lost, lost / c.mtbf_seconds)


def predict(c: DPCosts) -> dict[str, Overhead]:
    """All three strategies, checkpoint-restart at its Young/Daly interval."""
    return {o.strategy: o for o in (checkpoint_restart(c), rollback(c), lossy_forward(c))}


def expected_runtime(work_seconds: float, o: Overhead, mtbf_seconds: float) -> float:
    """Wall time to do ``work_seconds`` of failure-free training under ``o``.

    Failures keep arriving during the time lost to them, so the steady-state
    runtime is ``work (1 + steady) / (1 - lost / MTBF)``.

    Raises:
        ValueError: a failure costs at least an MTBF (the run would never finish).
    """
    waste = o.per_failure_seconds / mtbf_seconds
    if waste >= 1:
        raise ValueError(f"{o.strategy}: each failure costs {o.per_failure_seconds:.3g} s, "
                         f"not less than the MTBF of {mtbf_seconds:.3g} s; no progress")
    return work_seconds * (1 + o.steady_fraction) / (1 - waste)
