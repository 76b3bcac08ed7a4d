"""Warm actors kept on a cluster between drivers (engines/ray/driver/warm.py): leases, reset,
crashed drivers, expiry, release.

A second driver is a second :class:`ActorPool` (what a new ``trainthrough run``
process has: nothing idle of its own) attached to the same cluster's warm pool; the
test session's Ray plays the cluster, its namespace standing in for ``trainthrough``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from tests.test_ray_pool import _bsp, _dirty, _outcome, _same  # noqa: E402
from trainthrough.engines.ray.driver import cluster, warm  # noqa: E402
from trainthrough.engines.ray.driver.pool import POOL, ActorPool  # noqa: E402
from trainthrough.lab.runner import run_silent  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_session")


@ray.remote(num_cpus=0)
class _Driver:
    """Owns a lease token, as a driver process does: killing it is the driver crashing."""

    def token(self) -> list[Any]:
        self.ref = ray.put(b"")
        return [self.ref]


@ray.remote(num_cpus=0)
class _Idle:
    def ping(self) -> int:
        return 1


def _dead(handle: Any) -> bool:
    try:
        ray.get(handle.ping.remote(), timeout=30)
        return False
    except ray.exceptions.RayActorError:
        return True


def _until(cond: Any, seconds: float = 15.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


@pytest.fixture
def namespace(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The session's namespace plays trainthrough's; any warm pool is ended afterwards
    (an empty pool ends itself seconds after its last driver left: warm.EMPTY_SECONDS)."""
    monkeypatch.setattr(warm, "NAMESPACE", ray.get_runtime_context().namespace)
    yield
    pool = warm.find_pool()
    if pool is not None:
        with contextlib.suppress(ray.exceptions.RayActorError):  # it may have ended itself
            ray.get(pool.release.remote())
            ray.kill(pool, no_restart=True)
    # Its name is free only once it is gone: the next test's pool must be a new one.
    assert _until(lambda: warm.find_pool() is None)


@pytest.fixture
def warm_pool(namespace: None) -> Any:
    """How a test gets the cluster's pool: called once its drivers exist, as a driver
    asks for it when it attaches (an empty pool ends itself, warm.EMPTY_SECONDS)."""
    return warm.pool_handle


def test_an_actor_is_leased_to_one_driver_and_a_crashed_drivers_actors_are_killed(
        warm_pool: Any) -> None:
    a, b = _Driver.remote(), _Driver.remote()
    tokens = ray.get([a.token.remote(), b.token.remote()])
    pool = warm_pool()
    ray.get(pool.open.remote("a", tokens[0]))
    ray.get(pool.open.remote("b", tokens[1]))
    actor = _Idle.remote()
    assert ray.get(pool.give.remote("a", "k", "x", actor, 60.0)) is True
    assert ray.get(pool.take.remote("b", "other-key")) is None  # keys never mix
    name, handle = ray.get(pool.take.remote("b", "k"))
    assert name == "x"
    assert ray.get(pool.take.remote("a", "k")) is None, "one actor, two drivers"
    assert ray.get(pool.status.remote())["leased"] == 1
    ray.kill(b)  # driver b crashes while it holds the actor: its state is unknown
    assert _until(lambda: _dead(handle)), "a crashed driver's actor was left running"
    assert ray.get(pool.status.remote())["leased"] == 0


def test_a_new_pool_waits_for_its_first_lease(warm_pool: Any) -> None:
    """A pool started for a driver lives until that driver calls, even when it calls
    seconds later (a loaded machine): the reaper ended such pools after 1 s."""
    d = _Driver.remote()
    token = ray.get(d.token.remote())
    pool = warm_pool()
    time.sleep(warm.REAP_SECONDS * 2.5)
    ray.get(pool.open.remote("a", token), timeout=30)
    assert ray.get(pool.status.remote())["leases"] == 1


def test_release_ends_idle_actors_now_and_leased_ones_when_given_back(
        warm_pool: Any) -> None:
    d = _Driver.remote()
    token = ray.get(d.token.remote())
    pool = warm_pool()
    ray.get(pool.open.remote("a", token))
    idle, used = _Idle.remote(), _Idle.remote()
    for name, actor in (("i", idle), ("u", used)):
        ray.get(pool.give.remote("a", "k", name, actor, 600.0))
    ray.get(pool.take.remote("a", "k"))  # one of them is in use
    assert ray.get(pool.release.remote()) == (1, 1)
    leased = used if not _dead(used) else idle
    assert not _dead(leased), "an actor in use was ended under its run"
    name = "u" if leased is used else "i"
    assert ray.get(pool.give.remote("a", "k", name, leased, None)) is False
    assert _until(lambda: _dead(idle) and _dead(used))  # ray.kill: asynchronous
    later = _Idle.remote()  # a release is not sticky: a later keep is honoured
    assert ray.get(pool.give.remote("a", "k", "later", later, 600.0)) is True
    ray.get(pool.close.remote("a"))


def test_idle_actors_end_after_keep_and_the_empty_pool_ends_itself(warm_pool: Any) -> None:
    d = _Driver.remote()
    token = ray.get(d.token.remote())
    pool = warm_pool()
    ray.get(pool.open.remote("a", token))
    short, long = _Idle.remote(), _Idle.remote()
    ray.get(pool.give.remote("a", "k", "s", short, 0.5))
    ray.get(pool.give.remote("a", "k", "l", long, 600.0))
    assert _until(lambda: _dead(short))
    assert not _dead(long)
    assert ray.get(pool.release.remote()) == (1, 0)  # release ends the idle one now
    # ...by ray.kill, which returns before the process is gone: a ping sent at once may
    # still be answered (seen once in a full suite), so the death is waited for.
    assert _until(lambda: _dead(long))
    ray.get(pool.close.remote("a"))  # the last driver leaves: nothing held
    assert _until(lambda: warm.find_pool() is None), "an empty pool kept running"


@pytest.mark.usefixtures("namespace")
def test_a_second_driver_trains_on_leased_actors_as_on_fresh_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = _bsp(0, "checkpoint-sync")
    POOL.clear()
    fresh = _outcome(first)

    keeper = ActorPool()  # driver 1: --keep-warm; leaves every kind of state behind
    monkeypatch.setattr(cluster, "POOL", keeper)
    keeper.attach(60.0)
    run_silent(_dirty())
    keeper.detach()  # driver 1 exits
    warm_pool = warm.find_pool()
    assert warm_pool is not None, "driver 1's actors were not kept"
    kept = ray.get(warm_pool.status.remote())["idle"]
    assert keeper.created > 0 and kept == keeper.created

    second = ActorPool()  # driver 2: no --keep-warm, nothing idle of its own
    monkeypatch.setattr(cluster, "POOL", second)
    second.attach(None)
    reused = _outcome(first)
    assert second.created == 0 and second.leased > 0, "driver 2 started new actors"
    _same(fresh, reused)
    second.detach()  # what it leased went back (kept: driver 1 asked)
    status = ray.get(warm_pool.status.remote())
    assert status["leased"] == 0 and status["idle"] == kept
