"""Pure policies of the runtime: the stateless backlog and chain membership."""

from __future__ import annotations

import pytest

from trainthrough.ft.chain import on_death, on_join, successors
from trainthrough.ft.outage import Backlog, merge_plan


def test_merge_rules() -> None:
    counts, stale = [1, 1, 2], [2, 1, 0]
    assert [d.scale for d in merge_plan(counts, stale, "sum")] == [1.0, 1.0, 1.0]
    assert [d.scale for d in merge_plan(counts, stale, "mean")] == [0.25] * 3
    assert [d.scale for d in merge_plan(counts, stale, "scaled", threshold=50)] == [1.0] * 3
    assert [d.scale for d in merge_plan([30, 30], [0, 0], "scaled", threshold=50)] == [50 / 60] * 2
    assert [d.scale for d in merge_plan(counts, stale, "staleness")] == [1 / 3, 1 / 2, 1.0]
    with pytest.raises(ValueError):
        merge_plan([1], [0], "median")


def test_backlog_is_bounded_and_folds_the_oldest_without_losing_counts() -> None:
    b: Backlog[int] = Backlog(3)
    for x in range(10):
        b.add(x, staleness=0, combine=lambda a, c: a + c)
    items = b.drain()
    assert len(items) == 3 and b.merged == 7
    assert sum(u for u, _, _ in items) == sum(range(10))  # nothing dropped
    assert sum(c for _, _, c in items) == 10
    assert len(b) == 0


def test_chain_closes_over_a_dead_middle_and_promotes_after_a_dead_head() -> None:
    c = on_death(("a", "b", "c"), {"b"})
    assert c.members == ("a", "c") and c.rewire == (("a", "c"),) and c.promoted_head is None
    c = on_death(("a", "b", "c"), {"a"})
    assert c.members == ("b", "c") and c.promoted_head == "b" and c.rewire == ()
    c = on_death(("a", "b", "c"), {"c"})
    assert c.members == ("a", "b") and c.rewire == (("b", None),)
    assert on_death(("a",), {"a"}).lost_all


def test_replacement_joins_at_the_tail() -> None:
    c = on_join(("a", "b"), "n")
    assert c.members == ("a", "b", "n") and c.rewire == (("b", "n"),)
    assert successors(c.members) == {"a": "b", "b": "n", "n": None}
    with pytest.raises(ValueError):
        on_join(("a",), "a")
