"""Every timing decision of the ``dist`` controller and its ranks, with what it guards.

Wall-clock seconds. The values are tuned for a loaded machine (a CI runner, a laptop
running other tests): none may be shortened without measuring there first. Two more
live in the run's configuration, since a run may need its own: the collective timeout
(``cost.timeout_seconds``; ``launch(timeout=)``) and the liveness timeout
(``liveness_timeout``, ``--liveness-timeout``). docs/architecture.md has the table.

How a lost rank is found, by what it did:

- it died (a crash, SIGKILL, its host gone): its process ended, seen within
  :data:`TICK`; its peers' next collective fails within milliseconds;
- it stopped inside the group's life (SIGSTOP, a deadlock) while its peers wait on it
  in a collective: the collective timeout ends their wait and they report it
  (:func:`report_deadline` then gives it :data:`GRACE` to report too);
- it stopped where nobody waits on it: its heartbeat stops, and the liveness timeout
  ends it (:mod:`.liveness`);
- it computes (a long step, evaluation or checkpoint): it is alive and keeps beating,
  and nothing ends it. Its peers wait for it in their next collective up to the
  collective timeout, which is therefore the longest a first member may evaluate or
  save between two steps.
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

#: How long after a member reported that its collective timed out the others' reports
#: are awaited. Guards against a member that hung in the group: the others waited the
#: whole collective timeout for it, and those that were waiting too report within
#: milliseconds of each other; one that has not reported by then is presumed hung or
#: paused, and fenced out of the group (:mod:`.fencing`).
GRACE = 0.5

#: How long a rank waits for the controller's next plan. Guards against a controller
#: that is gone: the controller decides within the collective timeout of a group's end,
#: so this only ends ranks that would otherwise wait for ever.
PLAN_WAIT_SECONDS = 120.0

#: How long a rank whose own store connection broke tries a fresh one to leave its last
#: words. Guards against telling a controller that is gone: one that runs answers a
#: connection in milliseconds, and a rank orphaned by a signal to the whole job (its
#: zygote died before handing it over, :mod:`.zygote_main`) should end within seconds
#: of its run, quietly, not print a traceback into the terminal half a minute later.
LAST_WORDS_SECONDS = 3.0

#: How long the controller, once its own process got SIGTERM (the whole job's
#: preemption notice), waits for the group to stop after a step and write a
#: just-in-time checkpoint before the job ends anyway. Guards the notice itself: clouds
#: give 30 s (a preemptible VM, Kubernetes' default grace) to 2 minutes, so the job must
#: be gone within 30 s; one step, one save and the ranks' exits fit in far less.
JOB_NOTICE_SECONDS = 20.0

#: The longest between two heartbeats of a rank process (:mod:`.liveness`); a shorter
#: liveness timeout beats more often (:func:`heartbeat_period`). One store call each.
HEARTBEAT_SECONDS = 1.0


def heartbeat_period(liveness_timeout: float) -> float:
    """How often a rank process beats: a few beats fit in the liveness timeout, so one
    late beat (a loaded machine) is not taken for a stop."""
    return min(HEARTBEAT_SECONDS, liveness_timeout / 4)


def timed_out(waited: float, collective_timeout: float) -> bool:
    """Whether a collective that failed after ``waited`` seconds failed by its timeout
    (a member never came) rather than by a peer's death (its sockets closed). The
    backend starts its clock after the rank's, so a timeout never measures shorter."""
    return waited >= collective_timeout


def report_deadline(first_sign: float, first_timeout: float | None,
                    collective_timeout: float) -> float:
    """When a live member that has not reported since the group broke is presumed hung.

    ``first_sign``: when the group was first seen broken (a report, or a death);
    ``first_timeout``: when the first report that its collective *timed out* came
    (None: none did).

    After such a report the others follow within milliseconds, and a member still
    silent :data:`GRACE` later is the one the group waited for in vain. Otherwise a
    live member may be computing between two collectives (a first member evaluating
    or saving a checkpoint, a member behind on its step): it reaches its next
    collective, which fails at once, within the collective timeout (any longer and it
    would time out its peers in a healthy group too). Presuming it hung sooner would
    drop a healthy rank and turn the loss of one into the loss of two, or, when the
    group merely stopped to change (a replacement joins), into a failure.
    """
    if first_timeout is not None:
        return first_timeout + GRACE
    return first_sign + collective_timeout + GRACE
