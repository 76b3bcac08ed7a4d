"""Every timing decision of the ``dist`` controller and its ranks, with what it guards.

Wall-clock seconds. The values are tuned for a loaded machine (a CI runner, a laptop
running other tests): none may be shortened without measuring there first.
"""

from __future__ import annotations

#: The longest the controller sleeps between looks. Guards what no message announces (a
#: process ended, a joiner became ready, the wall limit): the ranks' messages wake the
#: controller at once (:class:`~.protocol.EventReader`'s doorbell).
TICK = 0.05

#: How long spawned rank processes have to become ready. Guards against a rank that
#: never starts (a broken environment): spawning and importing torch is slow on a
#: loaded machine, so it is generous.
START_SECONDS = 120.0

#: How long after the first survivor's report the others' are awaited. Guards against a
#: survivor that hung: the others hit the same broken collective and follow within
#: milliseconds, so one that has not reported by then is presumed failed (and killed).
GRACE = 0.5

#: How long a rank waits for the controller's next plan. Guards against a controller
#: that is gone: the controller decides within :data:`GRACE` of the last report, so this
#: only ends ranks that would otherwise wait for ever.
PLAN_WAIT_SECONDS = 120.0


def stall_seconds(collective_timeout: float) -> float:
    """How long the controller waits without any progress before it gives up on the run.

    Guards against a run that hangs with nobody reporting (every rank stuck): it must
    outlast several collective timeouts, since a recovery may see a few in a row.
    """
    return max(90.0, 6 * collective_timeout)


def report_deadline(first_sign: float, first_report: float | None,
                    collective_timeout: float) -> float:
    """When a live member that has not reported is presumed hung.

    Once one survivor reported (``first_report``), the others follow within
    milliseconds (they hit the same broken collective): :data:`GRACE` after it. A death
    seen before any report (``first_sign``) is another matter: a survivor learns of it
    from its own collective, between steps only at the next one and at worst by the
    collective timeout, later still on a loaded machine. Presuming it hung sooner would
    kill healthy ranks and turn the loss of one into a restart of all.
    """
    if first_report is not None:
        return first_report + GRACE
    return first_sign + collective_timeout + GRACE
