"""What a data-parallel recovery is measured against: the failure-free replica.

The perturbation of a recovery (:func:`trainthrough.ft.perturbation.perturbation`)
is the distance from the parameters the survivors hold once it is done to those the
failure-free group would hold at that point:

- while the interrupted step is outstanding (mini-batch rollback redoes it, a
  restart discards it, lossy forward at a step boundary never began it): the replica
  as the survivors hold it, since an uncommitted step never touched it
  (:mod:`trainthrough.dp.step`);
- once lossy forward has finished the step without the failed ranks' share: the
  step taken on the *whole* global batch, :func:`failure_free`.

Both are computed by the surviving ranks from what they hold, with the same code on
every host, so ``sim`` and gloo report the same quantity. Nothing decides on it.
"""

from __future__ import annotations

from trainthrough.dp.allreduce import Grads
from trainthrough.dp.collective import Collective, PeerLost
from trainthrough.dp.rank import Replica, Tensors
from trainthrough.dp.repair import own_share
from trainthrough.dp.step import InFlight, StepSpec


async def failure_free(rank: Replica, fl: InFlight, coll: Collective, spec: StepSpec,
                       done: int) -> Tensors | None:
    """The parameters after ``fl``'s step on the whole global batch, computed by the
    survivors ``coll.members`` before lossy forward completes it without the failed
    ranks' share (:func:`~trainthrough.dp.repair.complete`; call this first, on every
    member: it makes collectives of its own).

    Buckets ``[0, done)`` were reduced with every rank's share before the failure.
    For the others, the survivors compute the failed ranks' micro-batches, spread
    over them, and reduce them with their own: the simulated collective sums every
    micro-batch in index order, so ``sim`` gets the failure-free step's exact bits.
    The rank's own share is made whole in ``fl`` first
    (:func:`~trainthrough.dp.repair.own_share`: the completion then finds it done).
    Only the first member takes the step (on a copy of its state, put back after): it
    is the one that reports the recovery, and the others spare that copy's memory.

    Returns:
        None when the completion *is* the failure-free step: nothing was dropped
        (every bucket was reduced, or the failed ranks held no micro-batch); None on
        every member but the first.

    Raises:
        PeerLost: another member was lost meanwhile.
    """
    members = coll.members
    lost = [m for s, ms in sorted(fl.batch.share.items()) if s not in members for m in ms]
    if done >= len(spec.buckets) or not lost:
        return None
    own_share(rank, fl, spec, done)
    mine = Grads(fl.grads.numel, separate=fl.grads.flat is None, device=fl.grads.device)
    rank.gradients(fl.logical, lost[members.index(rank.rank_id)::len(members)], mine)
    # The full step's gradient: the buckets reduced before the failure, then the rest
    # (a summed ``mine`` takes each bucket's result once it was reduced).
    full = mine.flat if mine.flat is not None else fl.reduced.clone()
    count = fl.batch.micro_count
    try:
        for b in spec.buckets[done:]:
            total = await coll.allreduce(fl.grads.contributions() + mine.contributions(), b)
            full[b.start:b.stop] = total / count if spec.mean else total
    except PeerLost as e:  # where the completion would have stood: nothing reduced yet
        raise e.located("allreduce", done) from None
    if members.index(rank.rank_id) != 0:
        return None
    start = spec.buckets[done].start
    full[:start] = fl.reduced[:start]
    del mine
    # Take the full step and put the replica back (nothing was applied before it).
    saved = rank.state()
    rank.apply(full, fl.batch.lr_scale)
    after = rank.params
    rank.load(saved, own=True)
    return after
