"""The Ray driver's members: their life cycle, without any process (driver/members.py)."""

from __future__ import annotations

import itertools

import pytest

from trainthrough.engines.ray.driver.members import (
    TRANSITIONS,
    Member,
    MemberState,
    MemberStateError,
    OutageWork,
    Strike,
)

S = MemberState


def _member(state: MemberState = S.STARTING) -> Member:
    return Member("shard", 1, "tt-x-s1-3", handle=None, state=state, watch="ref")


def _at(state: MemberState) -> Member:
    """A member brought to ``state`` by allowed transitions only."""
    path = {S.SPARE: [], S.STARTING: [], S.SERVING: [S.SERVING],
            S.KILLED: [S.SERVING, S.KILLED], S.DEAD: [S.SERVING, S.DEAD]}[state]
    m = _member(S.SPARE if state is S.SPARE else S.STARTING)
    for to in path:
        m.transition(to, at=1.0)
    assert m.state is state
    return m


def test_the_table_is_the_life_cycle() -> None:
    assert set(TRANSITIONS) == set(MemberState)
    expected = {
        S.SPARE: {S.STARTING},
        S.STARTING: {S.SERVING, S.KILLED, S.DEAD},
        S.SERVING: {S.KILLED, S.DEAD},
        S.KILLED: {S.DEAD},
        S.DEAD: set(),
    }
    assert expected == TRANSITIONS
    # Every state leads to DEAD, which is final: a death is seen once.
    for state in MemberState:
        seen, todo = set(), [state]
        while todo:
            s = todo.pop()
            seen.add(s)
            todo += [t for t in TRANSITIONS[s] if t not in seen]
        assert S.DEAD in seen


@pytest.mark.parametrize(("frm", "to"), [
    (a, b) for a, b in itertools.product(MemberState, MemberState) if b not in TRANSITIONS[a]])
def test_a_transition_the_table_lacks_is_refused_and_changes_nothing(
        frm: MemberState, to: MemberState) -> None:
    m = _at(frm)
    before = (m.state, m.killed_at, m.killed_from, m.watch)
    with pytest.raises(MemberStateError, match=rf"shard tt-x-s1-3 cannot go from "
                                               rf"{frm.value} to {to.value}"):
        m.transition(to, at=9.0)
    assert (m.state, m.killed_at, m.killed_from, m.watch) == before


def test_a_killed_replica_holds_its_place_until_its_death_is_seen() -> None:
    m = _member()
    assert m.alive and not m.in_service and m.killed_at is None
    m.transition(S.SERVING)
    assert m.serving and m.in_service and m.alive
    m.transition(S.KILLED, at=5.0)
    assert (m.killed_at, m.killed_from, m.down_since) == (5.0, S.SERVING, 5.0)
    assert m.in_service and not m.serving and not m.alive
    assert m.watch == "ref"  # armed until the death is seen
    m.transition(S.DEAD, at=7.0)
    assert m.killed_at == 5.0, "the death is dated from the kill"
    assert m.watch is None and not m.in_service and not m.alive


def test_a_death_without_a_kill_is_dated_when_seen() -> None:
    m = _member()
    m.transition(S.SERVING)
    with pytest.raises(MemberStateError, match="not killed or dead"):
        _ = m.down_since
    m.transition(S.DEAD, at=3.0)
    assert (m.killed_at, m.killed_from, m.down_since) == (3.0, None, 3.0)


def test_a_replacement_killed_before_it_served_was_never_in_service() -> None:
    m = _member()
    m.transition(S.KILLED, at=2.0)
    assert not m.in_service and not m.serving and m.killed_from is S.STARTING
    with pytest.raises(MemberStateError, match="cannot go from killed to serving"):
        m.transition(S.SERVING)


def test_a_spare_serves_only_once_taken() -> None:
    m = _member(S.SPARE)
    assert m.alive and not m.in_service
    with pytest.raises(MemberStateError, match="from spare: starting"):
        m.transition(S.SERVING)
    m.transition(S.STARTING)
    m.transition(S.SERVING)
    assert m.serving


def test_a_strike_is_a_record() -> None:
    s = Strike(4, None, OutageWork(busy=1.0, total=2.0))
    assert s.version is None and s.work.total == 2.0
    with pytest.raises(AttributeError):
        s.iteration = 5  # type: ignore[misc]
