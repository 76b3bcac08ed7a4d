"""Synchronous chain links: a waiting push sends its group itself (in process, no Ray)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

pytest.importorskip("ray")

from trainthrough.engines.ray.chain.chain_link import ChainBroken, ChainLink, Replica  # noqa: E402
from trainthrough.engines.ray.chain.link_socket import LinkError  # noqa: E402
from trainthrough.engines.ray.chain.wire import Item  # noqa: E402


class _Replica(Replica):
    def __init__(self) -> None:
        self.applied: dict[int, int] = {}

    def apply(self, worker: int, seq: int, update: Any, scale: float) -> bool:
        if seq <= self.applied.get(worker, 0):
            return False  # a duplicate, as the shard's dedup says
        self.applied[worker] = seq
        return True

    def state(self) -> dict[str, torch.Tensor]:
        return {"x": torch.zeros(4096)}  # bigger than a few pushes: groups go as pushes


class _Forwarder:
    """Records each forward (thread, first and last position, state or pushes); the
    forwards listed in ``fail`` (by count) fail as a lost connection does."""

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.sent: list[tuple[str, int, int, bool]] = []
        self.fail = fail
        self.socket_sends = 0

    def send(self, succ: Any, epoch: int, gen: int, first: int, last: int,
             items: list, state: Any) -> Any:
        self.sent.append((threading.current_thread().name, first, last, state is not None))
        failing = len(self.sent) in self.fail

        class _Pending:
            def result(self) -> None:
                if failing:
                    raise LinkError("connection reset")

        return _Pending()

    def drop(self) -> None:
        pass


def _link(fwd: _Forwarder) -> tuple[threading.Condition, ChainLink]:
    cond = threading.Condition()
    link = ChainLink(cond, _Replica(), max_lag=8)
    link.forwarder = fwd  # type: ignore[assignment]
    with cond:
        link.rewire(object(), "sync")
    return cond, link


def _push(cond: threading.Condition, link: ChainLink, worker: int, seq: int) -> None:
    with cond:
        link.from_worker(Item(worker, seq, {"x": torch.ones(4)}, 1.0))


def test_every_group_is_sent_by_a_waiting_push_not_the_sender_thread() -> None:
    fwd = _Forwarder()
    cond, link = _link(fwd)
    threads = [threading.Thread(target=lambda w=w: [_push(cond, link, w, s)
                                                     for s in range(1, 21)],
                                name=f"push-{w}") for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert link.pos == link.durable == 60
    groups = [s for s in fwd.sent if not s[3]]
    assert groups and all(name.startswith("push-") for name, *_ in groups)
    # In position order, each group continuing the one before it.
    ends = [last for _, _, last, _ in fwd.sent]
    assert ends == sorted(ends) and ends[-1] == 60
    link.close()


def test_a_failed_forward_raises_for_its_push_and_the_state_goes_next() -> None:
    fwd = _Forwarder(fail=(3,))  # the first forward is the state sent when wired
    cond, link = _link(fwd)
    # That state goes first, by the sender thread (no push waits yet): waited for, so
    # the forwards below are numbered whichever thread got the lock first.
    with cond:
        assert link._wait(lambda: len(fwd.sent) == 1 and link._calls == 0, 5.0)
    _push(cond, link, 0, 1)
    with pytest.raises(ChainBroken):
        _push(cond, link, 0, 2)  # applied here, but its forward failed
    _push(cond, link, 0, 2)  # retried: a duplicate, acknowledged once the state is on
    assert link.durable == link.pos == 2
    assert fwd.sent[-1][3] and fwd.sent[-1][2] == 2  # the state, after the break
    link.close()
