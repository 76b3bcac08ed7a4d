"""The parameter server's acknowledged-loss accounting (engines/ray/driver/acknowledged.py),
in process: what a wiped chain's restore lost, and the end-of-run check beside it."""

from __future__ import annotations

from trainthrough.engines.ray.driver.acknowledged import AcknowledgedLedger, acknowledged


def _progress(acked: dict[int, int]) -> dict:
    return {"acked": acked}


def test_acknowledged_takes_the_highest_seq_over_a_workers_incarnations() -> None:
    progress = {"w0-a": _progress({0: 40, 1: 41}), "w0-b": _progress({0: (1 << 40) + 3}),
                "w1": _progress({1: 7})}
    index = {"w0-a": 0, "w0-b": 0, "w1": 1}
    assert acknowledged(progress, index) == {(0, 0): (1 << 40) + 3, (1, 0): 41, (1, 1): 7}


def test_a_reinitialized_chain_loses_every_pair_that_had_an_acknowledged_push() -> None:
    led = AcknowledgedLedger()
    acked = {(0, 0): 25, (0, 1): 24, (1, 0): 25}
    lost = led.restored(0, acked, {}, None)
    assert [(e["shard"], e["worker"], e["acknowledged"], e["applied"]) for e in lost] == [
        (0, 0, 25, -1), (0, 1, 24, -1)]
    # The workers push on to the restored shard: at the end its table is above what
    # they had acknowledged before the wipe. The end check finds nothing more; the
    # restore's losses stay counted.
    end = led.at_end({(0, 0): 90, (0, 1): 88, (1, 0): 90},
                     {0: {"s0": {0: 90, 1: 88}}, 1: {"s1": {0: 90}}})
    assert end == lost


def test_a_checkpoint_restore_loses_only_what_came_after_the_checkpoint() -> None:
    led = AcknowledgedLedger()
    # Worker 1 pushed nothing acknowledged since the checkpoint; worker 0 did.
    lost = led.restored(0, {(0, 0): 30, (0, 1): 20}, {0: 20, 1: 20}, 20)
    assert [(e["worker"], e["acknowledged"], e["applied"], e["restored_from"])
            for e in lost] == [(0, 30, 20, 20)]


def test_a_second_wipe_before_the_next_acknowledged_push_counts_nothing_twice() -> None:
    led = AcknowledgedLedger()
    assert len(led.restored(0, {(0, 0): 25}, {}, None)) == 1
    assert led.restored(0, {(0, 0): 25}, {}, None) == []  # the same push, already counted
    assert len(led.restored(0, {(0, 0): 26}, {}, None)) == 1  # a new one acknowledged since
    assert len(led.wiped) == 2


def test_a_loss_the_end_check_finds_is_not_the_restores_counted_again() -> None:
    """A wipe at the very end: the restored replica's table is still below what the
    workers acknowledged; that push was counted by the restore, once."""
    led = AcknowledgedLedger()
    acked = {(0, 0): 25}
    led.restored(0, acked, {}, None)
    assert len(led.at_end(acked, {0: {"s0": {}}})) == 1
    # A loss with a replica alive (a chain that kept one) is counted per replica.
    led2 = AcknowledgedLedger()
    end = led2.at_end({(0, 0): 25}, {0: {"s0": {0: 25}, "s1": {0: 24}}})
    assert [(e["replica"], e["applied"]) for e in end] == [("s1", 24)]


def test_a_chain_still_down_at_the_end_lacks_every_acknowledged_push() -> None:
    """A wipe whose restore had not happened when the run ended: nothing holds the
    shard's acknowledged pushes; a pair a restore counted is not counted again."""
    led = AcknowledgedLedger()
    led.restored(0, {(0, 0): 10}, {}, None)
    end = led.at_end({(0, 0): 10, (0, 1): 12, (1, 0): 12}, {0: {}, 1: {"s1": {0: 12}}})
    assert [(e.get("wiped"), e["worker"], e.get("replica")) for e in end] == [
        (True, 0, None), (None, 1, None)]
