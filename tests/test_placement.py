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
    assert place(0, "join", _alive(A), {A, B}, ranks, 1.0) is None  # nothing to take it
    # c joined: the first replacement takes it as a free node, the second as the
    # lost host's successor (not the survivors' host, which has as many ranks).
    first = place(0, "join", _alive(A, C), {A, B}, ranks, 3.0)
    assert first is not None and first.node == C and "none of the run's" in first.why
    second = place(2, "join", _alive(A, C), {A, B}, [*ranks, RankAt(C, True, False)], 3.0)
    assert second is not None and second.node == C
    assert second.why == "a node that joined after a host was lost"


def test_no_successor_within_the_wait_goes_beside_the_survivors() -> None:
    ranks = [RankAt(B, False, True), RankAt(A, True, False)]
    p = place(0, "join", _alive(A), {A, B}, ranks, NODE_WAIT)
    assert p is not None and p.node == A and "no new node within" in p.why


def test_a_process_crash_on_a_live_node_does_not_wait() -> None:
    # One node (a local Ray): its rank died, the node lives; nowhere else to go.
    ranks = [RankAt(A, False, True), RankAt(A, True, False)]
    p = place(0, "join", _alive(A), {A}, ranks, 0.0)
    assert p is not None and p.node == A and p.why == "the fewest live ranks"


def test_a_node_still_listed_alive_where_a_rank_died_is_taken_last() -> None:
    # b's rank died but Ray has not yet declared b dead: a node with live ranks and no
    # death (a) ties b on nothing: b has fewer live ranks, so it is tried (and placed
    # again if it turns out dead: dp.py); with equal loads, the node without a death.
    ranks = [RankAt(B, False, True), RankAt(A, True, False), RankAt(B, True, False)]
    p = place(0, "restart", _alive(A, B), {A, B}, ranks, 0.0)
    assert p is not None and p.node == A
