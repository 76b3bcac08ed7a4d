"""The ray engine on real processes: SIGKILLs, detection, recovery, chain guarantees."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from tests.ray_shards import Shards, shard_actors  # noqa: E402
from trainthrough.config import RunConfig  # noqa: E402
from trainthrough.engines.callbacks import Callback  # noqa: E402
from trainthrough.ft.chain import on_death  # noqa: E402
from trainthrough.lab.runner import run_silent  # noqa: E402
from trainthrough.lab.validate import for_strategy  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_session")


def _ray_cfg(strategy: str, **kw) -> RunConfig:  # noqa: ANN003
    base = dict(workload="mlr", strategy=strategy, engine="ray", shards=1, workers=2,
                consistency="async", target=0.35, eval_every=5, checkpoint_every=10,
                recovery_delay=0.5, failures=["shards=0@iter=25"], wall_limit=90.0,
                replicas=3)
    base.update(kw)
    # The interval only where the strategy saves (a chain alone saves nothing).
    return for_strategy(RunConfig(**base), strategy)  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["checkpoint-sync", "checkpoint-async", "chain-sync",
                                      "chain-async", "stateless"])
def test_a_real_sigkill_of_the_shard_and_training_reaches_its_target(strategy: str) -> None:
    # Bounded by wall time, not iterations: stateless workers on mlr compute thousands
    # of (buffered) steps during a 0.5 s outage, which would end the run at mlr's
    # default 3,000 iterations before the shard is back.
    s = run_silent(_ray_cfg(strategy, max_iterations=10**6))
    assert s.failures == 1
    assert s.converged, s
    assert len(s.recoveries) == 1
    rec = s.recoveries[0]
    if strategy == "chain-sync":  # two replicas survived the head: nothing acknowledged lost
        x = s.extras
        assert x["acknowledged_lost"] == 0 and x["acknowledged_lost_wiped"] == 0, s
    if strategy.startswith("chain"):
        assert rec.action == "failover"
        assert rec.recovery_seconds < 2.0
    else:
        # Down for the configured delay, then up and applying updates again.
        assert rec.recovery_seconds >= 0.5
        # The recovery policy's own action names, as on every engine.
        assert rec.action in ("restore-lost", "reinit")


def test_a_killed_worker_is_replaced() -> None:
    # The driver never blocks on a starting actor, so the run must last long enough
    # for the replacement (a new process importing torch) to come up: the kill comes
    # ~1 s in, a replacement starts in 2-5 s on a loaded 2-core machine. Every second
    # of it is ~1.6 CPU seconds of the suite's (20 s was 32).
    s = run_silent(_ray_cfg("checkpoint-async", failures=["worker=1@iter=20"],
                            stop_at_target=False, max_iterations=10**6, wall_limit=13.0))
    assert s.converged and s.failures == 1
    assert s.recoveries[0].action == "restart-worker"


@ray.remote
class _Ends:
    def returns(self) -> int:
        return 1

    def raises(self) -> None:
        raise ValueError("the worker's own error")

    def dies(self) -> None:
        os._exit(9)


def test_a_worker_run_that_ended_by_its_death_is_not_the_end_of_the_run() -> None:
    # A host lost takes its workers' runs down together, before Ray reports the actors
    # dead: were a dead run taken for a finished one, the run would end there, recording
    # no failure (it once did, on two hosts).
    from trainthrough.engines.ray.driver.engine import _returned

    a, b, c = _Ends.remote(), _Ends.remote(), _Ends.remote()  # type: ignore[attr-defined]
    done, error, death = a.returns.remote(), b.raises.remote(), c.dies.remote()
    ray.wait([done, error, death], num_returns=3, timeout=30)
    assert _returned(done)
    assert not _returned(death)
    with pytest.raises(ray.exceptions.RayTaskError, match="the worker's own error"):
        _returned(error)


class _Events(Callback):
    def __init__(self) -> None:
        self.records: list[dict] = []

    def on_event(self, event: dict) -> None:  # type: ignore[override]
        self.records.append(event)


@pytest.mark.parametrize("strategy", ["chain-sync", "base=chain-sync,checkpoint=full"],
                         ids=["reinit", "checkpoint"])
def test_a_wiped_chain_counts_the_acknowledged_pushes_it_took(strategy: str) -> None:
    """Both replicas of the only shard's chain SIGKILLed at once: the shard restarts
    from its initial values, or from its checkpoint of iteration 20 (every 10), and the
    pushes acknowledged since are gone. The summary counts them in updates, per worker
    (both had pushes acknowledged since), although the workers push on to the restored
    shard (before it was counted at all, the run said 0; then it counted the 2 pairs)."""
    events = _Events()
    s = run_silent(_ray_cfg(strategy, replicas=2, failures=["replicas=0,1@iter=25"],
                            stop_at_target=False, max_iterations=120, wall_limit=60.0),
                   events)
    assert s.failures == 2
    (up,) = [e for e in events.records if e["type"] == "up"]
    ckpt = up["restored_from"]
    assert (ckpt is None) == (strategy == "chain-sync"), up
    assert {r.action for r in s.recoveries} >= {"reinit" if ckpt is None else "restore-lost"}
    wiped = [e for e in s.extras["acknowledged_lost_detail"] if e.get("wiped")]
    assert sorted(e["worker"] for e in wiped) == [0, 1]
    x = s.extras
    # In updates: the pushes acknowledged that the state no longer holds; the pairs beside.
    lost = x["acknowledged_lost"]
    assert lost == x["acknowledged_lost_wiped"] == up["acknowledged_lost"] > 2
    assert x["acknowledged_lost_pairs"] == 2 and lost == sum(e["lost"] for e in wiped)
    # Independently: every push acknowledged, minus what the surviving shard holds (its
    # version: one per push applied, restored with its state), exactly.
    assert lost == x["updates_acknowledged"] - s.updates_applied, x
    # What the workers had acknowledged when it was wiped: while the shard is down each
    # worker waits with its step at its last acknowledged push (+1 if that push is
    # pending), one push a step: the restore's logical iteration (the workers' mean
    # step) times two, within the two pending pushes. Reinitialized, all of it is lost;
    # from the checkpoint of iteration 20, less what it held: at least 20 steps each
    # (the workers may have run ahead of the driver's count when the shard saved).
    assert up["iteration"] >= 25
    acked = (2 * up["iteration"] - 2, 2 * up["iteration"] + 1)
    if ckpt is None:
        assert acked[0] <= lost <= acked[1], (lost, up)
    else:
        assert ckpt == 20 and 0 < lost <= acked[1] - (2 * ckpt - 2), (lost, up)


def _chain(n: int, mode: str, dtype: object = None) -> Shards:
    import torch

    from trainthrough.workloads.base import OptimizerSpec

    actors = shard_actors(n, {"x": torch.zeros(4, dtype=dtype or torch.float32)},
                          OptimizerSpec(kind="add"))
    for a, b in zip(actors, actors[1:] + [None]):
        ray.get(a.set_successor.remote(b, mode))
    return actors


@pytest.mark.parametrize("position", [0, 1, 2], ids=["head", "middle", "tail"])
def test_chain_sync_loses_no_acknowledged_update(position: int) -> None:
    """Pushes keep coming while one replica is SIGKILLed; every acknowledged push is
    applied exactly once on the replicas that remain (a retried push is deduplicated)."""
    import torch

    actors = _chain(3, "sync")
    names = ("r0", "r1", "r2")
    handles = dict(zip(names, actors))
    pids = {n: ray.get(h.pid.remote()) for n, h in handles.items()}
    members = names
    acked: list[int] = []
    killed = threading.Event()

    def killer() -> None:
        while len(acked) < 30:
            time.sleep(0.001)
        os.kill(pids[names[position]], signal.SIGKILL)
        killed.set()

    threading.Thread(target=killer, daemon=True).start()
    seq = 0
    while seq < 80:
        seq += 1
        while True:
            try:
                ray.get(handles[members[0]].push.remote(0, seq, {"x": torch.ones(4)}))
                acked.append(seq)
                break
            except ray.exceptions.RayError:
                killed.wait(5)
                dead = {names[position]}
                change = on_death(members, dead)
                members = change.members
                for name, succ in change.rewire:
                    ray.get(handles[name].set_successor.remote(
                        handles[succ] if succ else None, "sync"))
    assert killed.is_set() and len(members) == 2
    assert acked == list(range(1, 81))
    for n in members:
        stats = ray.get(handles[n].stats.remote())
        assert stats["applied"][0] == 80
        version, values = ray.get(handles[n].pull.remote())
        assert values["x"].tolist() == [80.0] * 4  # each acknowledged push applied once
    actors.give_back()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tensors_a_frame_cannot_carry_are_forwarded_by_ray_call(mode: str) -> None:
    """A chain's forwards go over its socket as frames of the dtypes wire.DTYPES names;
    a parameter of another dtype (complex64 here) goes by Ray call instead, pushes and
    states alike, and reaches every replica exactly once."""
    import torch

    from trainthrough.engines.ray.chain import wire

    assert torch.complex64 not in wire.DTYPES.values()
    actors = _chain(3, mode, torch.complex64)
    for seq in range(1, 21):
        ray.get(actors[0].push.remote(0, seq, {"x": torch.ones(4, dtype=torch.complex64)}))
    for h in actors:  # async: the tail may still be catching up
        deadline = time.time() + 10
        while ray.get(h.stats.remote())["applied"].get(0) != 20 and time.time() < deadline:
            time.sleep(0.05)
        _, values = ray.get(h.pull.remote())
        assert values["x"].dtype == torch.complex64 and values["x"].tolist() == [20] * 4
    for h in actors[:2]:
        stats = ray.get(h.stats.remote())
        assert stats["forwarded"] > 0 and stats["sent_states"] > 0, stats
        assert stats["socket_sends"] == 0, stats
    actors.give_back()


@ray.remote(num_cpus=0)
class _StuckReplica:
    """A replacement whose state copy never returns (a stopped process, say)."""

    def load(self, state: object, chain: object = None) -> int:
        time.sleep(15)
        return 0


def test_a_replacement_that_hangs_in_its_copy_does_not_hold_the_tails_pushes() -> None:
    """The tail copies its state into a replacement with its lock held, so pushes wait
    meanwhile; a replacement that never answers must not hold them for ever: the copy
    gives up after its timeout, nothing changed, and the tail takes pushes again."""
    import torch

    tail_actors = _chain(1, "sync")
    (tail,) = tail_actors
    stuck = _StuckReplica.remote()  # type: ignore[attr-defined]
    t = time.perf_counter()
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(tail.attach_tail.remote(stuck, "sync", 1.0), timeout=12)
    assert time.perf_counter() - t < 10
    assert ray.get(tail.push.remote(0, 1, {"x": torch.ones(4)}), timeout=5) == 1
    version, values = ray.get(tail.pull.remote(), timeout=5)
    assert values["x"].tolist() == [1.0] * 4  # applied, and with no successor to wait for
    ray.kill(stuck)
    tail_actors.give_back()


def test_chain_failover_through_zookeeper_membership(zk_server) -> None:  # noqa: ANN001
    """With coordinator=zookeeper each replica holds an ephemeral node in a real
    ZooKeeper server; the head's SIGKILL is seen when its session expires, and the
    chain fails over to the next replica."""
    s = run_silent(_ray_cfg("chain-sync", coordinator="zookeeper",
                            zookeeper_hosts=zk_server.hosts))
    assert s.converged and s.failures == 1
    assert s.recoveries[0].action == "failover"
    # Detection waits for the 2 s session timeout, not Ray's ~20 ms notice.
    assert 1.0 <= s.recoveries[0].recovery_seconds < 6.0


@pytest.mark.parametrize("position", [0, 1, 2], ids=["head", "middle", "tail"])
def test_pipelined_chain_sync_loses_no_acknowledged_update(position: int) -> None:
    """Four workers push at once, so several pushes are in flight on every link when a
    replica is SIGKILLed; every acknowledged push ends up applied exactly once, in the
    same order, on every replica that remains."""
    import torch

    actors = _chain(3, "sync")
    names = ("r0", "r1", "r2")
    handles = dict(zip(names, actors))
    victim = ray.get(handles[names[position]].pid.remote())
    state = {"members": names, "rewired": False}
    guard = threading.Lock()
    acked: dict[int, list[int]] = {w: [] for w in range(4)}
    total = [0]

    def rewire() -> None:
        with guard:
            if state["rewired"]:
                return
            change = on_death(state["members"], {names[position]})
            for name, succ in change.rewire:
                ray.get(handles[name].set_successor.remote(
                    handles[succ] if succ else None, "sync"))
            state["members"], state["rewired"] = change.members, True

    def worker(w: int) -> None:
        for seq in range(1, 41):
            while True:
                try:
                    ray.get(handles[state["members"][0]].push.remote(
                        w, seq, {"x": torch.full((4,), float(w + 1))}))
                    break
                except ray.exceptions.RayError:
                    # Only the kill breaks the chain; the first to see it rewires, and
                    # everyone retries the same sequence number (dedup absorbs repeats).
                    while not state.get("killed"):
                        time.sleep(0.001)
                    rewire()
                    time.sleep(0.005)
            acked[w].append(seq)
            with guard:
                total[0] += 1
                if total[0] == 60:
                    os.kill(victim, signal.SIGKILL)
                    state["killed"] = True

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(acked[w] == list(range(1, 41)) for w in range(4))
    assert state["rewired"] and len(state["members"]) == 2
    survivors = [n for n in names if n != names[position]]
    expect = [40.0 * (1 + 2 + 3 + 4)] * 4
    for n in survivors:
        stats = ray.get(handles[n].stats.remote())
        assert stats["applied"] == {0: 40, 1: 40, 2: 40, 3: 40}
        assert ray.get(handles[n].pull.remote())[1]["x"].tolist() == expect
    actors.give_back()


def test_chain_positions_apply_in_order_and_a_replaced_head_is_refused() -> None:
    """In process, no Ray calls: a forward that arrives before the one ahead of it
    waits for it; once a replica leads (a worker pushed to it), forwards from the head
    it replaced are refused."""
    import torch

    from trainthrough.engines.ray.chain.chain_link import ChainBroken, ChainLink, Replica
    from trainthrough.engines.ray.chain.wire import Item

    cond = threading.Condition()
    order: list[int] = []

    class Log(Replica):
        def apply(self, worker: int, seq: int, update: object, scale: float) -> bool:
            order.append(seq)
            return True

    link = ChainLink(cond, Log(), max_lag=8)
    _under(cond, link.rewire, None, "sync")  # the tail
    item = Item(0, 2, {"x": torch.ones(1)}, 1.0)
    # Whichever call takes the lock first, position 2 is applied after position 1.
    early = threading.Thread(target=lambda: _under(cond, link.from_predecessor, 0, 2, [item]))
    early.start()
    _under(cond, link.from_predecessor, 0, 1, [Item(0, 1, {"x": torch.ones(1)}, 1.0)])
    early.join(10)
    assert order == [1, 2] and link.pos == link.durable == 2
    _under(cond, link.from_worker, Item(1, 1, {"x": torch.ones(1)}, 1.0))  # now the head
    assert link.head and link.gen == 1 and link.pos == 3
    with pytest.raises(ChainBroken):
        _under(cond, link.from_predecessor, 0, 4, [Item(0, 3, {"x": torch.ones(1)}, 1.0)])


def _under(cond: threading.Condition, fn, *args) -> None:  # noqa: ANN001, ANN002
    with cond:
        fn(*args)


@ray.remote(num_cpus=0)
class _Sleeper:
    def pid(self) -> int:
        return os.getpid()


def test_a_worker_killed_on_purpose_is_not_reported_as_an_oom_kill(capsys) -> None:  # noqa: ANN001
    """Ray's driver prints every worker death it hears of as "(raylet) A worker died
    ... killed by the OOM killer ...": for a kill the project injected (through
    engines/signals.send) it says nothing; for any other death it still speaks, which a
    second actor, killed behind the project's back, shows here."""
    from trainthrough.engines.signals import identify, send

    ours, other = _Sleeper.remote(), _Sleeper.remote()
    ours_pid, other_pid = ray.get([ours.pid.remote(), other.pid.remote()])
    assert send(identify(ours_pid))
    time.sleep(1.0)  # Ray reports deaths in the order they happen, as a rule
    fd = os.pidfd_open(other_pid)  # this test's own actor, identified just above
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)
    out, deadline = "", time.monotonic() + 30
    while f"Worker PID: {other_pid}" not in out and time.monotonic() < deadline:
        time.sleep(0.2)
        out += capsys.readouterr().out
    assert f"Worker PID: {other_pid}" in out, f"Ray did not report the other death: {out!r}"
    assert f"Worker PID: {ours_pid}" not in out
