"""Rebuilding a lost shard's rows from the parameters the workers last pulled.

In a parameter server every worker holds the parameters it last pulled, to compute
its next update: bulk-synchronous, the ones of the round before the failure (one
step old); bounded staleness, at most a few clocks old. A
:class:`~trainthrough.ps.worker.WorkerCopy` is that pull plus what makes it
comparable: the version of every shard when it was read.
:func:`rebuild` picks, for each row of a lost shard, the freshest copy a live worker
holds; rows no live worker holds (its worker was lost too, or workers pull only some
rows) are left for the checkpoint, or initial values without one.

Optimizer state is never rebuilt from workers (they never see it): it comes from the
checkpoint if there is one, else it starts fresh (our choice; docs in
:class:`~trainthrough.ft.recovery.FromWorkerCopies`).

Pure functions over tensors: engines gather the copies (in process, or from worker
actors, asking only for the lost shard's rows) and load the result into the shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainthrough.ps.layout import RowBlock
from trainthrough.ps.shard import Shard
from trainthrough.ps.worker import WorkerCopy

Params = dict[str, torch.Tensor]


@dataclass
class Rebuilt:
    """One lost shard's rows as rebuilt from worker copies.

    ``values[name]``: the shard's rows of ``name`` (local row order); valid where
    ``covered[name]`` is True. ``sources[worker]``: rows taken from that worker's copy
    (the workers asked: one request and one reply each). ``version``: the freshest copy
    version used for this shard (None: no live copy held any row).
    """

    values: Params = field(default_factory=dict)
    covered: Params = field(default_factory=dict)
    sources: dict[int, int] = field(default_factory=dict)
    version: int | None = None
    nbytes: int = 0

    @property
    def rows_from_workers(self) -> int:
        return sum(int(c.sum()) for c in self.covered.values())

    @property
    def rows(self) -> int:
        return sum(int(c.numel()) for c in self.covered.values())


def rebuild(shard_id: int, blocks: tuple[RowBlock, ...],
            copies: list[WorkerCopy]) -> Rebuilt:
    """Each row of shard ``shard_id`` from the freshest live copy that holds it.

    Copies are ranked by the shard's version at their pull (ties: the lower worker
    id, so the choice is deterministic); a row takes its value from the first ranked
    copy that holds it.

    Args:
        shard_id: the lost shard.
        blocks: its row blocks (the layout's ``shards[shard_id]``).
        copies: the copies of live workers only (a lost worker's copy is gone).
    """
    ranked = sorted(copies, key=lambda c: (-c.versions[shard_id], c.worker))
    out = Rebuilt()
    for b in blocks:
        covered = torch.zeros(b.rows, dtype=torch.bool)
        values: torch.Tensor | None = None
        for c in ranked:
            if b.name not in c.params:  # asked for its push only (Ray)
                continue
            src = c.params[b.name][b.start:b.stop]
            mask = c.holds(b.name)
            take = ~covered if mask is None else (mask[b.start:b.stop] & ~covered)
            n = int(take.sum())
            if n == 0:
                continue
            if values is None:
                values = torch.empty_like(src)
            values[take] = src[take]
            covered |= take
            out.sources[c.worker] = out.sources.get(c.worker, 0) + n
            out.nbytes += n * (src[0].numel() if src.dim() > 1 else 1) * src.element_size()
            v = c.versions[shard_id]
            out.version = v if out.version is None else max(out.version, v)
            if bool(covered.all()):
                break
        if values is not None:
            out.values[b.name] = values
        out.covered[b.name] = covered
    return out


def local_rows(covered: torch.Tensor) -> torch.Tensor:
    """The local row indices a mask marks (for :meth:`Shard.load_rows`)."""
    return covered.nonzero(as_tuple=True)[0]


def load_rebuilt(shard: Shard, rebuilt: Rebuilt) -> None:
    """Overwrite the shard's covered rows with the rebuilt values (optimizer state stays
    as the checkpoint or the reset left it).

    The shard's version becomes at least the freshest copy's, so versions keep
    counting forward and a later failure still ranks copies correctly (a checkpoint's
    older version would make copies pulled before this failure look fresher).
    """
    for name, covered in rebuilt.covered.items():
        if name in rebuilt.values and bool(covered.any()):
            rows = local_rows(covered)
            shard.load_rows(name, rows, rebuilt.values[name][rows])
    if rebuilt.version is not None:
        shard.version = max(shard.version, rebuilt.version)


def record(lost: tuple[int, ...], rebuilt: list[Rebuilt], from_checkpoint: bool,
           lags: list[int | None], replayed: list[int], copies: list[WorkerCopy],
           asked: int) -> dict[str, int | None]:
    """What a worker-copy recovery reports.

    Rows by source; the freshest copy's lag in updates (max over the lost shards;
    None: no copy used); ``rounds_replayed``: lost shards whose missed round was
    replayed; the transfer, per lost shard: a request and a reply to each of the
    ``asked`` live workers (its copy's version: a few bytes, not in ``bytes``), a pair
    to each worker whose rows are taken (the row values), and one per push slice
    replayed (its bytes).
    """
    from_workers = sum(r.rows_from_workers for r in rebuilt)
    rest = sum(r.rows for r in rebuilt) - from_workers
    used = [lag for lag in lags if lag is not None]
    version = {i: r.version for i, r in zip(lost, rebuilt)}
    push_bytes = sum(_nbytes(c.pushed[i]) for i in replayed for c in copies
                     if c.pushed is not None and c.versions[i] == version[i])
    return {"rows_from_workers": from_workers,
            "rows_from_checkpoint": rest if from_checkpoint else 0,
            "rows_initial": 0 if from_checkpoint else rest,
            "copy_lag": max(used) if used else None,
            "rounds_replayed": len(replayed),
            "messages": 2 * asked * len(lost) + 2 * sum(len(r.sources) for r in rebuilt)
            + 2 * sum(1 for i in replayed for c in copies
                      if c.pushed is not None and c.versions[i] == version[i]),
            "bytes": sum(r.nbytes for r in rebuilt) + push_bytes}


def _nbytes(t: Params) -> int:
    return sum(v.numel() * v.element_size() for v in t.values())


def replay(shard: Shard, rebuilt: Rebuilt, copies: list[WorkerCopy], lost_version: int,
           round_size: int, divide_by: int) -> bool:
    """Bulk-synchronous only: re-apply the one round the rebuilt rows missed, if whole.

    A copy pulled at version ``v`` is one round behind a shard lost at ``v + 1``; the
    live workers still hold their pushes of that round, computed from the copy. If all
    ``round_size`` of them are held, the shard applies their slices again through
    :meth:`Shard.apply_aggregate` (the same sum in the same order, divided by the
    round's ``divide_by``): with every row from a copy and an optimizer that keeps no
    state (``add``, ``sgd``) the lost rows come back exactly; with momentum or Adam the
    optimizer state is the checkpoint's, so close, not exact.

    A round missing a push (its worker died with the shard) is not replayed: the rows
    stay as the copy had them, one step's update away. Replaying the pushes that
    survived is no better in general: on lda it moved the lost rows further than the
    whole step (its pushes subtract each worker's share of the pulled counts).

    Returns:
        True if the round was replayed.
    """
    if rebuilt.version is None or lost_version != rebuilt.version + 1:
        return False
    pushes = [c.pushed for c in copies
              if c.pushed is not None and c.versions[shard.shard_id] == rebuilt.version]
    if len(pushes) != round_size:
        return False
    shard.apply_aggregate([p[shard.shard_id] for p in pushes], divide_by)
    shard.version = lost_version
    return True


Reply = tuple[int, int, Params, Params | None]  # worker, version, row slices, push slice


def recover_from_replies(shard: Shard, replies: list[Reply], from_checkpoint: bool,
                         lost_version: int | None, round_size: int, divide_by: int,
                         asked: int) -> dict[str, int | None]:
    """The lost shard's side where workers send only its slices (Ray's shard actor).

    ``replies``: from the workers the host picked among the ``asked`` (the freshest
    copy's holder, and for a replay every worker with a push from that version): its
    id, the shard's version at its pull, its copy of this shard's rows (empty: only
    its push was asked for), and its push slice of the round after the pull (None: not
    kept or not asked). ``lost_version``: the shard's version when it was lost, for
    a bulk-synchronous replay (None: no replay). Call after the checkpoint restore (or
    on a fresh shard); same choice, loading and replay as :func:`rebuild`,
    :func:`load_rebuilt` and :func:`replay`.

    Returns:
        The recovery's :func:`record`.
    """
    sid = shard.shard_id
    local = tuple(RowBlock(b.name, 0, b.rows) for b in shard.blocks)
    pad: list[Params] = [{} for _ in range(sid)]
    copies = [WorkerCopy(w, (-1,) * sid + (v,), rows, None,
                         None if push is None else [*pad, push])
              for w, v, rows, push in replies]
    r = rebuild(sid, local, copies)
    load_rebuilt(shard, r)
    replayed = [sid] if lost_version is not None and replay(
        shard, r, copies, lost_version, round_size, divide_by) else []
    lag = None if r.version is None or lost_version is None else lost_version - r.version
    return record((sid,), [r], from_checkpoint, [lag], replayed, copies, asked)
