"""The gloo controller's protocol pieces without rank processes: the doorbell that
replaces polling, and what the controller decides from the survivors' reports."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist

from trainthrough.config import RunConfig
from trainthrough.engines.gloo import protocol
from trainthrough.engines.gloo.fencing import Fences
from trainthrough.engines.gloo.group_state import GroupState, GroupStateError
from trainthrough.engines.gloo.messages import (
    Failed,
    Noticed,
    Reformed,
    Reported,
    Returned,
    Saved,
    parse,
)
from trainthrough.engines.gloo.protocol import (
    MAX_VALUE_BYTES,
    Doorbell,
    EventReader,
    Report,
    get,
    post,
    request,
    serve,
    write_report,
)
from trainthrough.engines.gloo.recovery import DistRecovery
from trainthrough.engines.gloo.timing import GRACE, report_deadline, timed_out
from trainthrough.ft.dp_policies import StragglerPolicy
from trainthrough.ft.strategy import resolve

pytestmark = pytest.mark.timeout(60)


def _until(cond: Any, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def test_the_doorbell_counts_requests_without_polling_and_closes() -> None:
    store = serve("127.0.0.1", timeout=5)
    request(store)  # made before the member listens: still heard
    bell = Doorbell(store, "ctl", 1)
    assert _until(lambda: bell.rung == 1)
    request(store)
    request(store)
    assert _until(lambda: bell.rung == 3) and bell.next_key == "ctl/4"
    bell.close()
    assert not bell._thread.is_alive()


def test_the_controller_sleeps_until_an_event_and_drains_each_once() -> None:
    store = serve("127.0.0.1", timeout=5)
    reader = EventReader(store)
    t0 = time.monotonic()
    reader.bell.wait(0.2)  # nothing posted: the full timeout
    assert time.monotonic() - t0 >= 0.19
    post(store, Reported(n=1, slot=2))
    t0 = time.monotonic()
    reader.bell.wait(5.0)  # woken by the post, long before the timeout
    assert time.monotonic() - t0 < 2.0
    [event] = reader.drain()
    assert parse(event) == Reported(n=1, slot=2, t=event["t"])
    assert reader.drain() == [] and not store.check(["evq/0"])  # read and rung: deleted
    # Control messages only: one that would carry something model-sized is refused
    # before it takes a slot (the store's server would drop the connection at 8 MiB).
    with pytest.raises(ValueError, match="'returned' message of .* bytes"):
        post(store, Returned(slot=0, value="x" * MAX_VALUE_BYTES))
    assert store.add("evq", 0) == 1
    reader.bell.close()


def _controller(strategy: str) -> tuple[DistRecovery, dist.Store, list[dict[str, Any]]]:
    store = dist.HashStore()
    emitted: list[dict[str, Any]] = []
    procs = SimpleNamespace(current={s: SimpleNamespace(slot=s, inc=0, died_at=None,
                                                        silent_since=None, fenced=False,
                                                        exitcode=None if s != 3 else -9,
                                                        process=SimpleNamespace())
                                     for s in range(4)},
                            kill=lambda p: None, fence=lambda p: setattr(p, "fenced", True),
                            alive=lambda s: s != 3, newly_dead=lambda: [])
    e = SimpleNamespace(cfg=RunConfig(paradigm="dp", engine="gloo", strategy=strategy,
                                      replace=False),
                        strategy=resolve(strategy), store=store,
                        procs=procs, pump=lambda: None,
                        emit=lambda ev: emitted.append(ev.to_record()),
                        saves=SimpleNamespace(checkpointer=SimpleNamespace(count=0)),
                        iteration=0, logical=0, result=SimpleNamespace(updates_lost=0),
                        stopping=False)
    rec = DistRecovery(e, [])  # type: ignore[arg-type]
    # A group of four broke: the controller waits for the reports.
    rec.members, rec.state = [0, 1, 2, 3], GroupState.REPORTING
    rec.on_event(parse({"type": "failure", "ids": [3], "spec": "rank=3@iter=9",
                        "phase": "allreduce:0", "phase_kind": "allreduce", "iteration": 9,
                        "logical": 9, "t": time.time()}))
    return rec, store, emitted


@pytest.mark.parametrize("split", [False, True])
def test_survivors_split_on_the_last_commit_catch_up_and_complete_nothing(split: bool) -> None:
    """Rank 3 died in the commit of step 9. Rank 1's collective failed; ranks 0 and 2
    may have completed it (a ring's last messages) and failed in step 10's instead."""
    rec, store, _ = _controller("lossy-forward")
    ahead = 10 if split else 9
    rec._decide({0: Report(0, "error", "allreduce", 0, executed=ahead + 1, logical=ahead),
                 1: Report(1, "error", "allreduce", 0, executed=10, logical=9),
                 2: Report(2, "error", "allreduce", 0, executed=ahead + 1, logical=ahead)})
    plan = get(store, "plan/1")
    assert plan["members"] == [0, 1, 2] and plan["action"] == "lossy"
    assert plan["sync"] == split and plan["logical"] == ahead
    # Completing the step would mix two steps: those behind copy one that committed.
    assert plan["complete"] == (not split)


def test_a_failure_after_the_commit_is_one_between_steps_for_the_survivors() -> None:
    rec, store, emitted = _controller("rollback")
    rec.log.fail_events[0] = replace(rec.log.fail_events[0], phase="update", phase_kind="update")
    rec._decide({s: Report(s, "error", "allreduce", 0, executed=11, logical=10)
                 for s in (0, 1, 2)})
    plan = get(store, "plan/1")
    # Step 9 was committed with every share: nothing to redo, the attempt under way
    # when the loss was found did not count.
    assert plan["action"] == "rollback" and plan["uncount"] and not plan["sync"]
    assert [x["type"] for x in emitted] == ["rank-fenced", "detection"]


def test_a_member_said_to_have_ended_is_fenced_and_what_it_writes_later_refused() -> None:
    """Rank 3's end was reported (Ray says so of a node it dropped, while a partition
    may leave the process running): once the group re-forms without it, it is fenced
    (``lost``), and a report or message it writes after the heal is refused, counted."""
    rec, _, emitted = _controller("rollback")
    rec._decide({s: Report(s, "error", "allreduce", 0, executed=10, logical=9)
                 for s in (0, 1, 2)})
    fenced = [x for x in emitted if x["type"] == "rank-fenced"]
    assert [(x["slot"], x["inc"], x["reason"]) for x in fenced] == [(3, 0, "lost")]
    assert rec.fences.out(3, 0) and not rec.fences.out(0, 0)
    assert rec.fences.refuses([3, 0], "exit") and not rec.fences.refuses([0, 0], "exit")
    assert rec.fences.refused == 1


def test_a_message_crosses_as_json_and_a_stranger_is_refused() -> None:
    sent = [Failed(ids=[3], spec="rank=3@iter=9", phase="allreduce:0", phase_kind="allreduce",
                   iteration=9, logical=9, pid=7, local_steps=2),
            Saved(iteration=5, payload=10, blocked_seconds=0.1, name="ckpt-00000005"),
            Reformed(n=2, ranks=[0, 1], action="lossy", perturbation=0.5)]
    for m in sent:
        assert parse(json.loads(json.dumps(m.wire()))) == m
    with pytest.raises(RuntimeError, match="unknown message 'x'"):
        parse({"type": "x"})
    with pytest.raises(RuntimeError, match="unknown fields"):
        parse({**sent[2].wire(), "extra": 1})


def test_the_group_changes_state_only_as_the_table_says() -> None:
    rec, _, _ = _controller("rollback")
    rec._decide({s: Report(s, "error", "allreduce", 0, executed=10, logical=9)
                 for s in (0, 1, 2)})
    assert rec.state is GroupState.TRAINING and rec.log.open[0].failed == [3]
    with pytest.raises(GroupStateError, match="from training to starting"):
        rec._to(GroupState.STARTING)  # a restart is decided only once the reports are in
    assert rec.state is GroupState.TRAINING


def test_a_member_is_presumed_hung_a_grace_after_a_timed_out_report_or_a_timeout_later() -> None:
    # A member's collective timed out: the group waited that long for the silent ones.
    assert report_deadline(10.0, 12.0, collective_timeout=5.0) == 12.0 + GRACE
    # A death or a report without a timeout first: a live member may be evaluating or
    # saving before its next collective, which fails at once, within the timeout.
    assert report_deadline(10.0, None, collective_timeout=5.0) == 15.0 + GRACE
    assert timed_out(5.0004, 5.0) and not timed_out(0.02, 5.0)


@pytest.mark.parametrize("waited", [0.01, 5.0])
def test_a_live_member_is_waited_for_unless_its_peers_timed_out_waiting_for_it(
        waited: float) -> None:
    """Rank 3 died; ranks 1 and 2 reported, rank 0 (alive) has not. Their collectives
    failed at once (a death): rank 0 may be evaluating or saving before its next
    collective, and is waited for up to the collective timeout. Had one of them waited
    out the collective timeout (5 s here), rank 0 is what the group waited for: a grace."""
    rec, store, emitted = _controller("rollback")
    timeout = rec.port.cfg.cost.timeout_seconds
    rec.first_sign = time.time()
    for s in (1, 2):
        write_report(store, 0, Report(s, "error", "allreduce", 0, executed=10, logical=9,
                                      waited=waited if s == 1 else 0.01, inc=0))
    assert not rec.tick() and rec.state is GroupState.REPORTING
    if waited >= timeout:
        assert rec.first_timeout is not None
        rec.first_timeout -= GRACE  # a grace later
    else:
        assert rec.first_timeout is None
        rec.first_sign -= timeout  # not yet: the collective timeout has not passed
        assert not rec.tick()
        rec.first_sign -= GRACE  # now it has
    assert rec.tick() and rec.state is GroupState.TRAINING
    assert get(store, "plan/1")["members"] == [1, 2]
    assert [x["failed"] for x in emitted if x["type"] == "detection"] == [["rank0", "rank3"]]
    assert rec.crashes.streak[-1].error.startswith("hung:")  # a loss nobody injected


def _until(cond: Any, seconds: float = 5.0) -> bool:
    end = time.time() + seconds
    while not cond() and time.time() < end:
        time.sleep(0.01)
    return bool(cond())


def test_a_closing_doorbell_never_hides_the_next_request() -> None:
    """A process that ends closes its doorbell by marking the key its thread waits on.
    The mark is not a request (peers still listening do not act on it), and the next
    request takes the key after it: a doorbell started later (a restart's fresh ranks,
    from the counter) hears it. Before, the mark reused the next request's key, and a
    stop asked after a checkpoint-restart was never heard (the run trained on to its
    iteration budget)."""
    store = serve("127.0.0.1", timeout=5)
    live = Doorbell(store, "ctl", 1)  # a member that keeps running
    ending = Doorbell(store, "ctl", 1)
    ending.close()  # marks ctl/1
    assert _until(lambda: live.rung == 1) and live.last == 0  # woken, no request
    fresh = Doorbell(store, "ctl", int(store.add("ctl", 0)) + 1)  # a restarted rank
    assert _until(lambda: fresh.rung == 1) and fresh.last == 0
    value = request(store)
    assert value == 2  # ctl/1 is the mark's
    assert _until(lambda: fresh.last == 2) and _until(lambda: live.last == 2)
    live.close()
    fresh.close()


def test_a_write_from_a_fenced_incarnation_is_refused_and_recorded_once() -> None:
    """The fencing token: a rank process signs what it posts with [slot, inc]; once the
    controller fenced that incarnation (a paused rank the group went on without), its
    late messages are refused unread, and its report, read again every tick, once."""
    store = serve("127.0.0.1", timeout=5)
    reader = EventReader(store)
    protocol.sign(1, 0)  # as rank_main does, once per rank process
    try:
        post(store, Reported(n=4, slot=1))
    finally:
        protocol.sign_out()
    [wire] = reader.drain()
    assert parse(wire).sender == [1, 0]
    emitted: list[Any] = []
    fences = Fences(emitted.append)
    assert not fences.refuses([1, 0], "report")  # a member: accepted
    fences.revoke(1, 0, "no-report")
    fences.revoke(1, 0, "no-report")  # once
    assert fences.refuses(parse(wire).sender, "report")
    assert not fences.refuses([1, 1], "report") and not fences.refuses(None, "metrics")
    assert fences.refuses([1, 0], "report", key="report/5")
    assert fences.refuses([1, 0], "report", key="report/5")  # refused, not recorded again
    assert [e.type for e in emitted] == ["rank-fenced", "write-refused", "write-refused"]
    assert fences.refused == 2
    reader.bell.close()


def test_a_stale_report_is_refused_and_the_plan_names_each_members_incarnation() -> None:
    """Slot 1's process inc 0 was replaced by inc 1 (it paused): a report signed by
    inc 0 is not its slot's, and the plan the controller writes names inc 1, which the
    woken inc 0 reads as: out."""
    rec, store, emitted = _controller("rollback")
    rec.port.procs.current[1].inc = 1
    write_report(store, 0, Report(1, "error", "allreduce", 0, executed=10, logical=9,
                                  inc=0))
    write_report(store, 0, Report(2, "error", "allreduce", 0, executed=10, logical=9,
                                  inc=0))
    got = rec._admitted(protocol.read_reports(store, 0, [1, 2]))
    assert sorted(got) == [2]
    assert [(x["type"], x["slot"], x["inc"]) for x in emitted
            if x["type"] == "write-refused"] == [("write-refused", 1, 0)]
    rec._publish(protocol.Plan(1, [0, 1, 2], "rollback"))
    plan = protocol.Plan(**get(store, "plan/1"))
    assert plan.incs == [0, 1, 0]
    assert plan.admits(1, 1) and not plan.admits(1, 0) and not plan.admits(3, 0)


@pytest.mark.parametrize("waited,late", [
    ({0: 0.81, 1: 0.01, 2: 0.8}, (1,)),  # 0 and 2 waited the deadline out for 1
    ({0: 0.01, 1: 0.02}, ()),  # a death broke the group: nobody was waited for
    ({0: 0.9, 1: 0.85}, ()),  # both waited: a member that never reports (hung) is late
])
def test_the_straggler_is_the_member_its_peers_waited_the_deadline_out_for(
        waited: dict[int, float], late: tuple[int, ...]) -> None:
    assert StragglerPolicy(0.8).decide(waited) == late
    assert StragglerPolicy(None).decide(waited) == ()
def _stopped_for_a_change(notices: tuple[int, ...]) -> tuple[DistRecovery, dist.Store,
                                                              list[dict[str, Any]]]:
    """A group of three that stopped after step 12 because the controller asked (every
    report ``ctl``), ``notices`` being the members with a preemption notice."""
    rec, store, emitted = _controller("rollback")
    rec.log.fail_events.clear()
    rec.log.failures = 0  # the stand-in's failure of rank 3 is not this group's
    rec.members = [0, 1, 2]
    for s in notices:
        rec.on_notice(Noticed(slot=s, inc=0, pid=100 + s, logical=11))
    return rec, store, emitted


def test_a_member_with_a_notice_is_drained_not_recovered() -> None:
    rec, store, emitted = _stopped_for_a_change((1,))
    assert rec.drains.leaving(rec.members) == [1]
    rec._decide({s: Report(s, "ctl", executed=12, logical=12) for s in (0, 1, 2)})
    plan = get(store, "plan/1")
    # The others go on from the step all three committed: nothing to roll back or redo.
    assert plan["members"] == [0, 2] and plan["action"] == "start" and plan["save"] is None
    assert [x["type"] for x in emitted] == ["preempt-notice", "drained"]
    assert emitted[1] == {"type": "drained", "slots": [1], "logical": 12, "ranks": [0, 2],
                          "n": 1}
    assert rec.drains.gone(rec.port.procs.current[1]) and rec.drains.drained == 1
    assert rec.log.open == [] and rec.log.failures == 0


@pytest.mark.parametrize("notices", [(0, 1, 2), ()])
def test_nobody_left_or_the_jobs_notice_stops_the_group_with_a_save(
        notices: tuple[int, ...]) -> None:
    """Every member has a notice, or the job got one (the controller's own SIGTERM):
    the group stops after the step, and its first member writes it first."""
    rec, store, _ = _stopped_for_a_change(notices)
    if not notices:
        rec.jit = True
    rec._decide({s: Report(s, "ctl", executed=12, logical=12) for s in (0, 1, 2)})
    plan = get(store, "plan/1")
    assert plan["members"] == [] and plan["action"] == "stop" and plan["save"] == 0
    assert rec.stopped == [0, 1, 2] and rec.stop_logical == 12 and rec.members == []
    assert rec.all_drained == bool(notices)


def test_sigterm_in_a_rank_process_is_its_notice_not_its_end() -> None:
    """The watch a rank process installs (notice.py): SIGTERM, from outside or delivered
    by the injector, posts one notice from its thread, and the process goes on;
    closing it gives SIGTERM back to the handler it had."""
    import os
    import signal

    from trainthrough.engines.gloo.notice import RankNotice

    store = serve("127.0.0.1", timeout=5)
    reader = EventReader(store)
    before = signal.getsignal(signal.SIGTERM)
    notice = RankNotice.install(store.host, store.port, slot=2, inc=1)
    assert notice is not None and RankNotice.current is notice
    notice.logical = lambda: 7
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # this very process: it must survive it
        assert _until(lambda: notice.given.is_set())
        assert _until(lambda: store.add("evq", 0) == 1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one is the same notice
        time.sleep(0.2)
        [m] = [parse(w) for w in reader.drain()]
        assert isinstance(m, Noticed) and (m.slot, m.inc, m.pid, m.logical) == \
            (2, 1, os.getpid(), 7)
        assert m.spec is None and m.notice_seconds is None  # from outside
    finally:
        notice.close()
        reader.bell.close()
    assert signal.getsignal(signal.SIGTERM) == before and RankNotice.current is None
