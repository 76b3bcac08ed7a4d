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

import json

import torch

from trainthrough.dp.allreduce import Bucket, Grads
from trainthrough.dp.collective import Collective, PeerLost
from trainthrough.dp.rank import Replica, Tensors
from trainthrough.dp.step import InFlight, StepSpec

#: Tensors smaller than this travel packed together, in messages of about this size;
#: larger ones are sent from and received into the replicas' own memory.
PACK_BYTES = 4 * 2**20


def own_share(rank: Replica, fl: InFlight, spec: StepSpec, done: int) -> None:
    """Make ``fl.grads`` hold this rank's whole share of buckets ``done`` onwards, once
    the group agreed that buckets ``[0, done)`` are reduced (:meth:`InFlight.rewind`).

    Micro-batches it had not computed are computed. A summed vector may hold part of
    one (a failure found during the backward, where buckets start on an overlapping
    host): its share is then computed again, in place when nothing was reduced, else
    aside (one gradient's memory, released at once) and copied into the buckets left.
    """
    fl.rewind(done)
    g, mine = fl.grads, fl.batch.share[rank.rank_id]
    missing = [m for m in mine if m.index not in g.indices]
    if not missing:
        return
    if g.flat is None:
        rank.gradients(fl.logical, missing, g)
        return
    start = spec.buckets[done].start if done < len(spec.buckets) else g.numel
    if start == 0:  # nothing reduced: computed again in place
        g.fresh, g.indices = True, []
        rank.gradients(fl.logical, mine, g)
        return
    fresh = Grads(g.numel, separate=False, device=g.device)
    rank.gradients(fl.logical, mine, fresh)
    assert fresh.flat is not None
    g.flat[start:] = fresh.flat[start:]
    g.indices = fresh.indices


async def complete(rank: Replica, fl: InFlight, coll: Collective, spec: StepSpec,
                   done: int) -> int:
    """Lossy forward: finish ``fl`` with the survivors' shares and apply it.

    Buckets ``[0, done)`` were reduced before the failure with every rank's share
    and are kept; the rest are reduced again over the survivors (``coll.members``),
    averaged over their micro-batches only: the failed ranks' share is dropped.
    Micro-batches this rank had not computed yet are computed first (:func:`own_share`).

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
    own_share(rank, fl, spec, done)
    fl.phase, fl.buckets_done = "allreduce", done
    try:
        for b in spec.buckets[done:]:
            fl.reduce_into(b, await coll.allreduce(fl.grads.contributions(), b), count,
                           spec.mean)
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

    Collectives, in order: who holds state (a sum of one-hot flags, so every member
    picks the same donor); the size of the donor's manifest, then the manifest (JSON:
    the counters, and the key, dtype and shape of every tensor of
    :meth:`~trainthrough.dp.rank.Replica.state`: parameters, optimizer state,
    buffers, the step count); then the tensors themselves as bytes, in the
    manifest's order (:func:`_broadcast`). Any replica's state, whatever its shapes (a
    joiner's optimizer may hold none yet), and never a pickle.

    Nothing is serialized: the donor sends its live tensors and a member receives into
    its own where it has the same key, dtype and shape (its parameters), into new ones
    otherwise, so the transfer needs no copy of the model beside it. Members that
    hold state hold the donor's replica already (they committed the same steps): what
    they receive writes the values they have.

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
    live = rank.state(copy=False)
    text = b""
    if me == donor:
        text = json.dumps({"counters": list(counters), "tensors": [
            [k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in live.items()]}
        ).encode()
    size = torch.tensor([len(text)], dtype=torch.int64)
    await coll.broadcast([size], src=donor)
    buf = (torch.frombuffer(bytearray(text), dtype=torch.uint8) if me == donor
           else torch.zeros(int(size[0]), dtype=torch.uint8))
    await coll.broadcast([buf], src=donor)
    manifest = json.loads(bytes(buf.numpy()))
    if me == donor:
        await _broadcast([v.contiguous() for v in live.values()], donor, True, coll,
                         rank.device)
        return list(counters)
    tensors: Tensors = {}
    for key, dtype, shape in manifest["tensors"]:
        kind = getattr(torch, dtype)
        if not isinstance(kind, torch.dtype):
            raise RuntimeError(f"the donor's state names an unknown dtype {dtype!r}")
        mine = live.get(key)
        fits = (mine is not None and mine.dtype == kind and list(mine.shape) == shape
                and mine.is_contiguous() and mine.device == rank.device)
        tensors[key] = mine if fits else torch.empty(shape, dtype=kind,  # type: ignore[assignment]
                                                     device=rank.device)
    await _broadcast(list(tensors.values()), donor, False, coll, rank.device)
    rank.load(tensors, own=True)
    return [int(x) for x in manifest["counters"]]


async def _broadcast(tensors: list[torch.Tensor], src: int, sending: bool,
                     coll: Collective, device: torch.device) -> None:
    """Member ``src``'s ``tensors`` over everyone's (same shapes, contiguous, in order;
    ``sending``: this member is ``src``): each of :data:`PACK_BYTES` or more in place,
    the smaller ones packed together."""
    pack: list[torch.Tensor] = []

    async def flush() -> None:
        if not pack:
            return
        sizes = [t.numel() for t in pack]
        buf = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
        if sending:
            torch.cat(pack, out=buf)
        await coll.broadcast([buf], src=src)
        if not sending:
            for t, part in zip(pack, buf.split(sizes)):
                t.copy_(part)
        pack.clear()

    for t in tensors:
        raw = t.reshape(-1).view(torch.uint8)
        if raw.numel() >= PACK_BYTES:
            await coll.broadcast([raw], src=src)
            continue
        pack.append(raw)
        if sum(p.numel() for p in pack) >= PACK_BYTES:
            await flush()
    await flush()
