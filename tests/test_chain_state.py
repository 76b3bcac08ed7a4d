"""Chain forwards that carry a replica's whole state (group commit) instead of pushes."""

from __future__ import annotations

import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from tests.frames import through_bytes  # noqa: E402
from trainthrough.engines.ray.chain import wire  # noqa: E402
from trainthrough.engines.ray.chain.chain_link import ChainLink, Replica  # noqa: E402
from trainthrough.ps.shard import Shard  # noqa: E402
from trainthrough.workloads.base import OptimizerSpec  # noqa: E402


def _shard() -> Shard:
    from trainthrough.ps.layout import make_layout

    values = {"w": torch.randn(3, 5), "b": torch.randn(5)}
    return Shard(0, make_layout(values, 1).shards[0], OptimizerSpec(kind="adam", lr=0.1),
                 values)


def test_a_forwarded_state_comes_back_bit_identical() -> None:
    shard = _shard()
    for seq in range(1, 4):
        shard.apply_once(seq % 2, seq, {"w": torch.randn(3, 5), "b": torch.randn(5)})
    state = shard.state_dict()
    assert wire.framable(list(state.values()))
    op, _, _, back = through_bytes(*wire.frame_state(1, 3, state))
    assert op == "state"
    assert back.keys() == state.keys()
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    other = _shard()
    other.load_state_dict(back)
    assert other.version == 3 and other.applied == shard.applied
    # The forwarded copy stays still while the shard moves on.
    kept = back["value/w"].clone()
    shard.apply_once(0, 9, {"w": torch.ones(3, 5), "b": torch.ones(5)})
    assert torch.equal(back["value/w"], kept)


class _Fake(Replica):
    def __init__(self) -> None:
        self.applied: list[int] = []
        self.loaded: list[dict] = []

    def apply(self, worker: int, seq: int, update: object, scale: float) -> bool:
        self.applied.append(seq)
        return True

    def load(self, state: dict) -> None:
        self.loaded.append(state)


def test_a_state_ahead_is_taken_and_covers_the_pushes_before_it() -> None:
    """In process: a state at position 5 is taken (a push forwarded for position 5
    later is skipped, one for 6 applied); a state behind is only acknowledged; a state
    from a replaced head's generation is refused."""
    from trainthrough.engines.ray.chain.chain_link import ChainBroken

    cond, fake = threading.Condition(), _Fake()
    link = ChainLink(cond, fake, max_lag=8)
    with cond:
        link.rewire(None, "sync")  # the tail
        link.from_predecessor(1, 1, [wire.Item(0, 1, {}, 1.0)])
        link.from_state(1, 5, {"x": torch.ones(1)})
        assert link.pos == link.durable == 5 and len(fake.loaded) == 1
        link.from_predecessor(1, 5, [wire.Item(0, 5, {}, 1.0), wire.Item(0, 6, {}, 1.0)])
        assert fake.applied == [1, 6] and link.pos == 6
        link.from_state(1, 3, {"x": torch.zeros(1)})  # behind: nothing taken
        assert len(fake.loaded) == 1 and link.pos == 6
        link.from_state(2, 7, {"x": torch.ones(1)})  # a new head's generation
        with pytest.raises(ChainBroken):
            link.from_state(1, 8, {"x": torch.ones(1)})


def test_a_promoted_replica_refuses_its_old_head_before_any_worker_pushes() -> None:
    """A tail promoted because its head was lost (ZooKeeper expired it: perhaps only
    cut off) leads a new generation from the promotion: a forward of the old head that
    comes after it (the partition healed) is refused, though no worker pushed yet, and
    leading is done once (a worker's first push then keeps the generation)."""
    from trainthrough.engines.ray.chain.chain_link import ChainBroken

    cond, fake = threading.Condition(), _Fake()
    link = ChainLink(cond, fake, max_lag=8)
    with cond:
        link.rewire(None, "sync")  # the tail of the old head, generation 1
        link.from_predecessor(1, 1, [wire.Item(0, 1, {}, 1.0)])
        link.lead()  # promoted by the driver
        assert link.head and link.gen == 2
        with pytest.raises(ChainBroken, match="replaced head"):
            link.from_predecessor(1, 2, [wire.Item(1, 7, {}, 1.0)])  # the old head's
        with pytest.raises(ChainBroken, match="replaced head"):
            link.from_state(1, 2, {"x": torch.ones(1)})
        assert fake.applied == [1] and fake.loaded == [] and link.pos == 1
        link.from_worker(wire.Item(0, 2, {}, 1.0))
        assert link.gen == 2 and link.pos == link.durable == 2 and fake.applied == [1, 2]



@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_replicas_end_bit_identical_to_the_head_with_adam(mode: str) -> None:
    """Four workers push at once into a chain of three whose shards run Adam: every
    replica ends with the head's parameters, optimizer state, version and dedup table,
    bit for bit. Asynchronous groups hold up to 16 pushes, so there some forwards
    carry the state (not only the first, sent when the chain is wired)."""
    from tests.ray_shards import shard_actors

    values = {"w": torch.randn(64, 32), "b": torch.randn(32)}
    actors = shard_actors(3, values, OptimizerSpec(kind="adam", lr=0.01), prefix="s")
    for a, b in zip(actors, actors[1:] + [None]):
        ray.get(a.set_successor.remote(b, mode))

    def worker(w: int) -> None:
        g = torch.Generator().manual_seed(w)
        for seq in range(1, 31):
            update = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}
            ray.get(actors[0].push.remote(w, seq, update))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    deadline = time.monotonic() + 20
    while mode == "async" and time.monotonic() < deadline:
        if all(ray.get(a.stats.remote())["lag"] == 0 for a in actors[:2]):
            break
        time.sleep(0.05)
    head = ray.get(actors[0].state.remote())
    assert int(head["version"][0]) == 120
    for a in actors[1:]:
        state = ray.get(a.state.remote())
        assert all(torch.equal(state[k], v) for k, v in head.items())
        assert ray.get(a.stats.remote())["applied"] == {0: 30, 1: 30, 2: 30, 3: 30}
    if mode == "async":
        assert ray.get(actors[0].stats.remote())["sent_states"] > 1
    for a in actors[:2]:  # every forward went over the link's socket, none by Ray call
        stats = ray.get(a.stats.remote())
        assert stats["socket_sends"] == stats["forwarded"] > 0
    actors.give_back()
