"""The parameter server's acknowledged-loss accounting (engines/ray/driver/acknowledged.py),
in process and in updates: what a wiped chain's restore lost, the end-of-run check beside
it, and both against an independent count of the pushes themselves."""

from __future__ import annotations

import torch

from trainthrough.engines.ray.driver.acknowledged import AcknowledgedLedger, acknowledged
from trainthrough.ps.layout import RowBlock
from trainthrough.ps.shard import Shard, clone_state
from trainthrough.workloads.base import OptimizerSpec


def _progress(acked_pushes: dict[int, int]) -> dict:
    return {"acked_pushes": acked_pushes}


def _shard() -> Shard:
    return Shard(0, (RowBlock("w", 0, 2),), OptimizerSpec(kind="sgd", lr=0.5),
                 {"w": torch.zeros(2, 3)})


def test_acknowledged_sums_a_workers_incarnations() -> None:
    progress = {"w0-a": _progress({0: 40, 1: 41}), "w0-b": _progress({0: 3}),
                "w1": _progress({1: 7})}
    index = {"w0-a": 0, "w0-b": 0, "w1": 1}
    assert acknowledged(progress, index) == {(0, 0): 43, (1, 0): 41, (1, 1): 7}


def test_a_shard_counts_the_pushes_it_holds_and_they_travel_with_its_state() -> None:
    s = _shard()
    u = {"w": torch.ones(2, 3)}
    assert s.apply_once(0, 1, u) and s.apply_once(0, 2, u) and s.apply_once(1, 1 << 40, u)
    assert not s.apply_once(0, 2, u)  # a duplicate is held once
    assert s.held == {0: 2, 1: 1} and s.version == 3
    other = _shard()
    other.load_state_dict(clone_state(s.state_dict()))
    assert other.held == s.held and other.applied == s.applied
    # A table saved before pushes were counted (two columns): none counted.
    old = clone_state(s.state_dict())
    old["applied"] = old["applied"][:, :2]
    other.load_state_dict(old)
    assert other.applied == s.applied and other.held == {}
    other.reset({"w": torch.zeros(2, 3)})
    assert other.held == {} and other.applied == {}


def test_a_reinitialized_chain_loses_every_acknowledged_push() -> None:
    led = AcknowledgedLedger()
    lost = led.restored(0, {(0, 0): 25, (0, 1): 24, (1, 0): 25}, {}, None)
    assert [(e["worker"], e["acknowledged"], e["held"], e["lost"]) for e in lost] == [
        (0, 25, 0, 25), (1, 24, 0, 24)]
    # The workers push on to the restored shard: both counts grow by the same pushes,
    # so the end check finds the same loss, not a second one.
    end = led.at_end({(0, 0): 90, (0, 1): 88, (1, 0): 90},
                     {0: [{0: 65, 1: 64}], 1: [{0: 90}]})
    assert (end.updates, end.pairs, led.wiped) == (49, 2, 49)


def test_a_second_wipe_adds_only_what_it_lost_beyond_the_first() -> None:
    led = AcknowledgedLedger()
    assert [e["lost"] for e in led.restored(0, {(0, 0): 25}, {0: 20}, 20)] == [5]
    assert led.restored(0, {(0, 0): 25}, {0: 20}, 20) == []  # the same loss, found again
    # 10 more acknowledged and held, then a wipe back to a checkpoint 3 pushes older.
    assert [e["lost"] for e in led.restored(0, {(0, 0): 35}, {0: 27}, 30)] == [3]
    assert led.wiped == 8


def test_the_end_check_takes_the_fullest_replica_and_never_less_than_a_restore() -> None:
    led = AcknowledgedLedger()
    # A chain that kept replicas: the tail lags (async), the head holds every push.
    assert led.at_end({(0, 0): 25}, {0: [{0: 25}, {0: 24}]}).updates == 0
    # No replica left at the end: every acknowledged push is gone.
    assert led.at_end({(0, 0): 25}, {0: []}).updates == 25
    # Pushes applied but never acknowledged (a worker killed before the answer) make
    # the state hold more than was acknowledged: the restore's finding stands.
    led.restored(0, {(0, 0): 25}, {0: 5}, 10)
    assert led.at_end({(0, 0): 30}, {0: [{0: 40}]}).updates == 20
    # Shards not counted (no chains) are left out.
    assert led.at_end({(0, 0): 25, (1, 0): 9}, {1: [{0: 9}]}).updates == 0


def test_the_count_agrees_with_the_pushes_themselves() -> None:
    """A chain's life with two wipes, one back to a checkpoint and one to nothing, and
    a worker replaced midway; every push logged by the test. The ledger's losses, per
    worker and in all, equal the acknowledged pushes minus those the surviving state
    holds, counted two independent ways: from the log, and from the shard's version."""
    u = {"w": torch.ones(2, 3)}
    replicas = [_shard(), _shard()]
    acked: dict[str, dict[int, int]] = {}  # per worker incarnation, as workers report
    log: dict[int, list[int]] = {0: [], 1: [], 2: []}  # per worker: seqs the state holds
    seq = {"w0": 0, "w1": 0, "w2": 0}
    index = {"w0": 0, "w1": 1, "w2": 2, "w1-b": 1}
    led = AcknowledgedLedger()

    def push(name: str, n: int) -> None:
        for _ in range(n):
            seq[name] += 1
            for r in replicas:  # a synchronous chain: acknowledged once on every replica
                r.apply_once(index[name], seq[name], u)
            acked.setdefault(name, {0: 0})[0] += 1
            log[index[name]].append(seq[name])

    def wipe(state: dict[str, torch.Tensor] | None, kept: dict[int, list[int]]) -> None:
        restored = _shard()
        if state is not None:
            restored.load_state_dict(state)
        replicas[:] = [restored]
        log.update({w: list(s) for w, s in kept.items()})
        led.restored(0, acknowledged({k: _progress(v) for k, v in acked.items()}, index),
                     restored.held, None)

    push("w0", 7)
    push("w1", 5)
    push("w2", 3)
    checkpoint = clone_state(replicas[0].state_dict())
    at_checkpoint = {w: list(s) for w, s in log.items()}
    push("w0", 4)
    push("w2", 6)
    wipe(checkpoint, at_checkpoint)  # lost: w0 4, w2 6
    push("w0", 2)
    push("w1", 3)
    seq["w1-b"] = 1 << 40  # w1 replaced: its successor's sequence numbers start far above
    push("w1-b", 4)
    wipe(None, {0: [], 1: [], 2: []})  # reinitialized: everything acknowledged is lost
    push("w0", 5)
    push("w2", 1)
    replicas.append(_shard())
    replicas[1].load_state_dict(clone_state(replicas[0].state_dict()))  # a new tail
    push("w1-b", 2)

    total = acknowledged({k: _progress(v) for k, v in acked.items()}, index)
    end = led.at_end(total, {0: [r.held for r in replicas]})
    by_worker = {d["worker"]: d["lost"] for d in end.detail}
    from_log = {w: total[(0, w)] - len(log[w]) for w in log}
    assert by_worker == {w: n for w, n in from_log.items() if n > 0}
    assert end.updates == sum(total.values()) - replicas[0].version == sum(from_log.values())
    # 42 acknowledged (w0 18, w1 and its successor 14, w2 10), 8 held after the second
    # wipe (w0 5, w1 2, w2 1).
    assert by_worker == {0: 13, 1: 12, 2: 9} and (end.updates, end.pairs) == (34, 3)
    assert led.wiped == end.updates  # every loss came from a wipe
