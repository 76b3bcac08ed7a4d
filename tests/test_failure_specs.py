"""Every form of the failure spec language, and every malformed one exits 2."""

from __future__ import annotations

import pytest

from trainthrough.engines import registry
from trainthrough.errors import UserError
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.faults.spec import parse, parse_one, validate
from trainthrough.ft.strategy import resolve


@pytest.mark.parametrize("text,check", [
    ("shards=1@iter=300", lambda s: s.kind == "shard" and s.ids == (1,) and s.at_iter == 300),
    ("shards=0,2@iter=10", lambda s: s.ids == (0, 2)),
    ("shards=50%@iter=300", lambda s: s.fraction == 0.5),
    ("worker=2@iter=100", lambda s: s.kind == "worker" and s.ids == (2,)),
    ("shards=0@time=40s", lambda s: s.at_time == 40.0),
    ("shards=0@time=500ms", lambda s: s.at_time == 0.5),
    ("shards=0@time=2min", lambda s: s.at_time == 120.0),
    ("shard=any@mtbf=120s,max=3", lambda s: s.any_one and s.mtbf == 120 and s.max_count == 3),
    ("shard=all@mtbf=300iter", lambda s: s.every and s.mtbf_unit == "iter"),
    ("rank=1@iter=50,phase=allreduce:2", lambda s: s.kind == "rank" and s.phase == "allreduce:2"),
    ("rank=1@iter=50,phase=forward,mode=hang", lambda s: s.mode == "hang"),
    ("rank=1@iter=40,mode=pause:5s", lambda s: s.mode == "pause" and s.pause_seconds == 5.0),
    ("rank=1@iter=40,mode=pause:250ms", lambda s: s.pause_seconds == 0.25),
    ("rank=1@time=3s,mode=pause:1.5min", lambda s: s.pause_seconds == 90.0),
    ("rank=1@iter=40,mode=slow:4x", lambda s: s.mode == "slow" and s.slow_factor == 4.0),
    ("rank=any@iter=4,mode=slow:1.5x", lambda s: s.slow_factor == 1.5 and s.pause_seconds is None),
    ("shards=1@iter=230,phase=recovery", lambda s: s.phase == "recovery"),
    ("rank=1@iter=40,mode=preempt:10s", lambda s: s.mode == "preempt" and s.notice == 10.0),
    ("rank=1@iter=40,mode=preempt:2min", lambda s: s.notice == 120.0),
    ("rank=1@iter=40,mode=preempt:500ms", lambda s: s.notice == 0.5),
    ("rank=1@iter=40", lambda s: s.mode == "crash" and s.notice is None),
])
def test_every_form_parses(text: str, check) -> None:  # noqa: ANN001
    assert check(parse_one(text))


@pytest.mark.parametrize("text", [
    "shards=1", "shards=1@@iter=3", "disk=1@iter=3", "shards=150%@iter=3", "shards=0%@iter=3",
    "shards=x@iter=3", "shards=1@iter=-3", "shards=1@iter=abc", "shards=1@time=soon",
    "shards=1@mtbf=0s", "shards=1@mtbf=10", "shards=1@when=3", "shards=1@iter=3,phase=lunch",
    "shards=1@iter=3,mode=explode", "shards=1@iter=3,color=red", "shards=1,1@iter=3",
    "shards@iter=3", "shards=1@iter=3,max=x",
    # ASCII digits only: str.isdigit() and int() accept these, the language does not.
    "shards=1@iter=\u00b2", "shards=\u00b2@iter=3", "shards=1@iter=\u0663", "shards=1@time=\u0663s",
    "shard=any@mtbf=1s,max=200000000", "shard=any@mtbf=1s,max=0", "shards=1@iter=3,max=2",
    "shards=1@iter=3,phase=forward,phase=update", "shards=1@time=" + "9" * 400 + "s",
    "shards=1@iter=99999999999999999999",
    "rank=1@iter=3,mode=pause", "rank=1@iter=3,mode=pause:0s", "rank=1@iter=3,mode=pause:5",
    "rank=1@iter=3,mode=pause:2h", "rank=1@iter=3,mode=slow:1x", "rank=1@iter=3,mode=slow:4",
    "rank=1@iter=3,mode=slow:4x,mode=crash",
    # a preemption's notice: positive, with a unit, at most MAX_NOTICE
    "rank=1@iter=3,mode=preempt", "rank=1@iter=3,mode=preempt:", "rank=1@iter=3,mode=preempt:0s",
    "rank=1@iter=3,mode=preempt:10", "rank=1@iter=3,mode=preempt:5iter",
    "rank=1@iter=3,mode=preempt:-1s", "rank=1@iter=3,mode=preempt:4000s",
    "rank=1@iter=3,mode=preempt:\u0663s", "rank=1@iter=3,mode=preempt:1s:2s",
])
def test_malformed_specs_are_user_errors(text: str) -> None:
    with pytest.raises(UserError, match="failure spec"):
        parse_one(text)


@pytest.mark.parametrize("text", ["shards=7@iter=3", "worker=4@iter=3", "rank=0@iter=3"])
def test_ids_checked_against_sizes(text: str) -> None:
    with pytest.raises(UserError):
        validate(parse(text), {"shard": 4, "worker": 4})


def test_semicolons_join_specs() -> None:
    assert [s.kind for s in parse("shards=1@iter=3; worker=0@iter=5")] == ["shard", "worker"]


def test_fraction_resolves_to_that_many_distinct_shards_seeded() -> None:
    specs = parse("shards=50%@iter=3")
    a = FailureSchedule(specs, {"shard": 8}, seed=1).pending[0]
    b = FailureSchedule(specs, {"shard": 8}, seed=1).pending[0]
    assert a.ids == b.ids and len(set(a.ids)) == 4


def test_mtbf_draws_are_seeded_and_capped() -> None:
    specs = parse("shard=any@mtbf=100s,max=5")
    a = FailureSchedule(specs, {"shard": 4}, seed=3).pending
    b = FailureSchedule(specs, {"shard": 4}, seed=3).pending
    assert len(a) == 5 and a == b
    times = [e.at_time for e in a]
    assert times == sorted(times) and all(t > 0 for t in times)


def test_mtbf_is_drawn_lazily_the_same_events_as_drawn_all_at_once() -> None:
    # max=100000 must cost nothing up front: events are drawn as the run reaches them,
    # and the ones it reaches are exactly the start of the full list.
    sizes = {"shard": 8}
    lazy = FailureSchedule(parse("shard=any@mtbf=10s,max=100000"), sizes, seed=4)
    fired = lazy.due(0, 200.0)
    full = FailureSchedule(parse("shard=any@mtbf=10s,max=50"), sizes, seed=4).pending
    assert 5 < len(fired) < 50
    assert [(e.ids, e.at_time) for e in fired] == [(e.ids, e.at_time) for e in full[:len(fired)]]
    assert lazy.next_time() == full[len(fired)].at_time > 200.0
    assert lazy.due(0, 200.0) == [] and lazy.fired == fired


def test_a_random_spec_does_not_shift_other_specs_picks() -> None:
    alone = FailureSchedule(parse("shards=50%@iter=7"), {"shard": 8}, seed=2).pending
    mixed = FailureSchedule(parse("shard=any@mtbf=5s;shards=50%@iter=7"), {"shard": 8},
                            seed=2).pending
    assert [e for e in mixed if e.at_iter == 7] == alone


def test_due_fires_once_and_respects_phase() -> None:
    sched = FailureSchedule(parse("shards=0@iter=5;shards=1@iter=5,phase=recovery"),
                            {"shard": 2}, seed=0)
    assert sched.due(4, 0.0) == []
    fired = sched.due(5, 0.0)
    assert [e.ids for e in fired] == [(0,)]
    assert sched.due(6, 0.0) == []
    assert [e.ids for e in sched.due(6, 0.0, phase="recovery")] == [(1,)]


@pytest.mark.parametrize("spec", ["shards=9@iter=3", "shards=lots@iter=3", "shards=1@iter="])
def test_cli_malformed_spec_exits_2_with_one_line(cli, tmp_path, spec: str) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    r = cli("run", "--workload", "mlr", "--fail", spec, "--out", str(out), "--quiet")
    assert r.code == 2
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    assert not (out / "summary.json").exists()


def test_engines_that_cannot_deliver_a_notice_refuse_it() -> None:
    """gloo and sim (on its virtual clock) claim mode=preempt; Ray's data parallel (an
    actor's SIGTERM is Ray's) does not, so validation refuses it there before anything
    starts, and so does the parameter server."""
    specs = parse("rank=1@iter=8,mode=preempt:10s")
    assert registry.claims("gloo", "dp", resolve("rollback"), specs) == "bsp"
    assert registry.claims("sim", "dp", resolve("rollback"), specs) == "bsp"
    assert registry.claims("sim", "ps", resolve("checkpoint-restart"),
                           parse("shards=1@iter=8,mode=preempt:10s")) is None
    assert registry.claims("ray", "dp", resolve("rollback"), specs) is None
    assert registry.claims("ray", "ps", resolve("checkpoint-restart"),
                           parse("shards=1@iter=8,mode=preempt:10s")) is None
def test_a_pause_and_a_slow_down_travel_with_their_events() -> None:
    sched = FailureSchedule(parse("rank=1@iter=3,mode=pause:5s;rank=0@iter=4,mode=slow:4x"),
                            {"rank": 2}, seed=0)
    pause, slow = sched.pending
    assert (pause.mode, pause.pause_seconds, pause.slow_factor) == ("pause", 5.0, None)
    assert (slow.mode, slow.pause_seconds, slow.slow_factor) == ("slow", None, 4.0)
