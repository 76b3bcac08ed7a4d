"""Where a data-parallel rank goes on a Ray cluster (engines/ray/driver/placement.py),
decided without Ray: the rules in order, each named in the decision."""

from __future__ import annotations

from trainthrough.engines.ray.driver.placement import NODE_WAIT, RankAt, place

A, B, C = "a" * 8, "b" * 8, "c" * 8
ADDR = {A: "10.0.0.1", B: "10.0.0.2", C: "10.0.0.3"}


def _alive(*nodes: str) -> dict[str, str]:
    return {n: ADDR[n] for n in nodes}


def test_the_first_ranks_go_round_the_nodes_by_slot() -> None:
    nodes = [place(s, "fresh", _alive(B, A), set(), [], 0.0) for s in range(3)]
    assert [p.node for p in nodes if p] == [A, B, A]
    assert nodes[1] is not None and nodes[1].address == ADDR[B]


def test_a_lost_hosts_ranks_wait_for_its_successor_then_all_go_there() -> None:
    # b hosted slots 0 and 2 and was lost; a keeps slot 1; Ray lists b dead.
    ranks = [RankAt(B, False, True), RankAt(A, True, False), RankAt(B, False, True)]
    assert place(0, "join", _alive(A), {A, B}, ranks, 1.0, home=B) is None  # b is gone
    # c joined: the first replacement takes it as a free node, the second as the
    # lost host's successor (not the survivors' host, which has as many ranks).
    first = place(0, "join", _alive(A, C), {A, B}, ranks, 3.0, home=B)
    assert first is not None and first.node == C and "none of the run's" in first.why
    second = place(2, "join", _alive(A, C), {A, B}, [*ranks, RankAt(C, True, False)], 3.0,
                   home=B)
    assert second is not None and second.node == C
    assert second.why == "a node that joined after a host was lost"


def test_no_successor_within_the_wait_goes_beside_the_survivors() -> None:
    ranks = [RankAt(B, False, True), RankAt(A, True, False)]
    p = place(0, "join", _alive(A), {A, B}, ranks, NODE_WAIT, home=B)
    assert p is not None and p.node == A and "no new node within" in p.why


def test_a_process_crash_on_a_live_node_is_replaced_where_it_was() -> None:
    # One node (a local Ray): its rank died, the node lives; nowhere else to go.
    ranks = [RankAt(A, False, True), RankAt(A, True, False)]
    p = place(0, "join", _alive(A), {A}, ranks, 0.0, home=A)
    assert p is not None and p.node == A and p.why == "the node its rank ran on"
    # Two nodes, a crash on b: back to b, not to the node with fewer ranks.
    ranks = [RankAt(B, False, True), RankAt(B, True, False), RankAt(A, True, False)]
    p = place(0, "join", _alive(A, B), {A, B}, ranks, 0.0, home=B)
    assert p is not None and p.node == B


def test_two_ranks_of_a_host_not_yet_declared_dead_both_go_back_to_it() -> None:
    # Ray still lists b alive right after both its ranks died: both replacements go to
    # b (not one to b and the other, the tie broken, to the survivors' a for good). b
    # is gone, so neither actor starts: dp.py places them again, b now avoided and dead.
    ranks = [RankAt(B, False, True), RankAt(A, True, False), RankAt(B, False, True)]
    first = place(0, "join", _alive(A, B), {A, B}, ranks, 0.0, home=B)
    second = place(2, "join", _alive(A, B), {A, B}, [*ranks, RankAt(B, True, False)], 0.0,
                   home=B)
    assert first is not None and second is not None and first.node == second.node == B
    assert place(0, "join", _alive(A), {A, B}, ranks, 1.0, home=None) is None  # waits
