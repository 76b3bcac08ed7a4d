"""What a surviving rank does about the step a failure interrupted, once for every host.

The recovery policy (:mod:`trainthrough.ft.dp_policies`) decides; every surviving
rank then carries the decision out on its own :class:`~trainthrough.dp.step.InFlight`
record, over a group its host formed anew:

- mini-batch rollback: nothing to undo (an uncommitted step never touched the
  replica, :mod:`trainthrough.dp.step`): the host runs the same step again on the
  smaller group;
- lossy forward: :func:`complete` finishes the step with what the survivors have;
- a replacement joins: :func:`share_state` copies the first member's replica.

- survivors that disagree on the last committed step (a member's last collective
  completed and another's did not): :func:`share_state` from one that committed.

Call order after a failure: the host forms the survivors' group, then each member
calls the same of these (collectives must match).
"""

from __future__ import annotations

import safetensors.torch
import torch

from trainthrough.dp.allreduce import Bucket
from trainthrough.dp.collective import Collective, PeerLost
from trainthrough.dp.rank import Replica
from trainthrough.dp.step import InFlight, StepSpec


async def complete(rank: Replica, fl: InFlight, coll: Collective, spec: StepSpec,
                   done: int) -> int:
    """Lossy forward: finish ``fl`` with the survivors' shares and apply it.

    Buckets ``[0, done)`` were reduced before the failure with every rank's share
    and are kept; the rest are reduced again over the survivors (``coll.members``),
    averaged over their micro-batches only: the failed ranks' share is dropped.
    Micro-batches this rank had not computed yet are computed first.

    Args:
        done: buckets every survivor completed (the minimum the host gathered).

    Returns:
        The micro-batches of the global batch that were dropped (none if every
        bucket had been reduced before the failure).

    Raises:
        PeerLost: another member was lost meanwhile (located at the bucket).
    """
    count = fl.batch.micro_of(coll.members)
    dropped = fl.batch.micro_count - count if done < len(spec.buckets) else 0
    seen = {i for i, _ in fl.contribs}
    missing = [m for m in fl.batch.share[rank.rank_id] if m.index not in seen]
    fl.contribs += rank.gradients(fl.logical, missing)
    fl.phase, fl.buckets_done = "allreduce", done
    try:
        for b in spec.buckets[done:]:
            fl.reduce_into(b, await coll.allreduce(fl.contribs, b), count, spec.mean)
            fl.buckets_done = b.index + 1
    except PeerLost as e:
        raise e.located(fl.phase, fl.buckets_done) from None
    rank.apply(fl.whole(spec), fl.batch.lr_scale)
    fl.committed = True
    return dropped


async def share_state(rank: Replica, coll: Collective, counters: list[int],
                      holder: bool = True) -> list[int]:
    """Every member takes the replica and ``counters`` of the first member that holds
    state (a joiner, ``holder=False``, receives; it may have the lowest slot).

    Three collectives: who holds state (a sum of one-hot flags, so every member picks
    the same donor), the size of the donor's state, then the state itself as
    safetensors bytes (:meth:`~trainthrough.dp.rank.Rank.state`: parameters, optimizer
    state, buffers, the step count) with the host's counters (executed steps, cursor,
    ...): any replica's state, whatever its shapes (a joiner's optimizer may hold none
    yet), and never a pickle.

    Returns:
        The donor's ``counters`` (every member passes the same length).

    Raises:
        PeerLost: a member was lost meanwhile.
        RuntimeError: no member holds state.
    """
    n = len(coll.members)
    me = coll.members.index(rank.rank_id)
    flags = torch.zeros(n)
    flags[me] = 1.0
    held = await coll.allreduce([(0, flags)] if holder else [], Bucket(0, 0, n))
    donors = torch.nonzero(held).flatten().tolist()
    if not donors:
        raise RuntimeError("a group of joiners only: nobody to copy the replica from")
    donor = int(donors[0])
    blob = b""
    if me == donor:
        state = {k: v.cpu() for k, v in rank.state().items()}  # bytes are host memory
        state["meta/counters"] = torch.tensor(counters, dtype=torch.int64)
        blob = safetensors.torch.save(state)
    size = torch.tensor([len(blob)], dtype=torch.int64)
    await coll.broadcast([size], src=donor)
    buf = (torch.frombuffer(bytearray(blob), dtype=torch.uint8) if me == donor
           else torch.zeros(int(size[0]), dtype=torch.uint8))
    await coll.broadcast([buf], src=donor)
    if me == donor:
        return list(counters)
    received = safetensors.torch.load(buf.numpy().tobytes())
    rank.load(received)
    return [int(x) for x in received["meta/counters"]]
