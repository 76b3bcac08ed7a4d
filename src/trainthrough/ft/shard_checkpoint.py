"""Saving and restoring one parameter-server shard: full or prioritized (SCAR).

This is the one checkpoint writer of the parameter server. It runs wherever the shard
lives (``sim``: in the engine's process, one per shard; ``ray``: inside each shard's
actor), so every engine writes the same files and restores the same way; engines only
decide *when* (the strategy's :class:`~trainthrough.ft.checkpointing.CheckpointPolicy`)
and how a write spends time (virtual clock, or a background thread).

Call order: :meth:`ShardCheckpoint.plan` (under the shard's lock: picks what to save
and snapshots it), then :meth:`ShardCheckpoint.write` (may run in the background; the
bookkeeping of a prioritized save is committed only once it is on disk), and on a
failure :meth:`ShardCheckpoint.restore`.

Full saves hold the shard's whole state under tag ``shard<i>`` at step = iteration.
Prioritized saves (fraction r < 1) hold the rows picked by
:func:`~trainthrough.ft.prioritized_rows.select_rows` under tag ``shard<i>-prio``, numbered
by a save counter (the iteration can rewind); a byte credit of ``r`` of a full save per
save keeps the bytes per N equal to one full checkpoint. Recovery replays the
prioritized saves oldest to newest, so each row gets its freshest saved copy; a save is
deleted once no row's freshest copy lives in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainthrough.errors import CheckpointCorrupt
from trainthrough.ft.checkpoint import CheckpointInfo, CheckpointStore, require_ints
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.prioritized_rows import INDEX_BYTES, row_change, select_rows
from trainthrough.ps.shard import Shard, clone_state

Tensors = dict[str, torch.Tensor]
OnCorrupt = Callable[[str], None]


@dataclass
class Planned:
    """A save picked and snapshotted, not yet written."""

    tag: str
    step: int
    tensors: Tensors
    meta: dict[str, Any]
    payload_bytes: int
    commit: Callable[[], None] = field(default=lambda: None)


class ShardCheckpoint:
    """Full and prioritized saves of one shard, and its restore."""

    def __init__(self, shard: Shard, x0: Tensors, store: CheckpointStore, seed: int = 0,
                 reuse_snapshot: bool = False) -> None:
        """``reuse_snapshot``: copy full saves into one preallocated buffer (no allocation
        on the critical path). Only for hosts that never plan a save while the previous
        one is still being written (the ray actor's persister skips such saves)."""
        self.shard, self.store = shard, store
        self._reuse = reuse_snapshot
        self._buffer: Tensors = {}
        self.x0 = {n: v.clone() for n, v in x0.items()}
        i = shard.shard_id
        self.full_tag, self.prio_tag = f"shard{i}", f"shard{i}-prio"
        # Prioritized bookkeeping: the values as last saved, the save that holds each
        # row's freshest copy (-1: never saved, i.e. initial values), the round-robin
        # cursor and the bytes this shard may still write.
        self._ref = {n: v.clone() for n, v in x0.items()}
        self._owner = {n: torch.full((v.shape[0],), -1, dtype=torch.int64)
                       for n, v in x0.items()}
        self._cursor, self._credit, self._saves = 0, 0.0, 0
        self.read_bytes = 0  # what the last restore read (the sim host charges it)
        self._gen = torch.Generator().manual_seed(seed * 1009 + 31 + i)

    # -- saving -----------------------------------------------------------------
    def plan(self, d: CheckpointDecision, iteration: int) -> Planned | None:
        """Pick and snapshot what ``d`` saves (None: no credit for a row yet)."""
        if d.fraction >= 1.0:
            tensors = self._snapshot(self.shard.state_dict())
            return Planned(self.full_tag, iteration, tensors, {"iteration": iteration},
                           _nbytes(tensors))
        return self._partial(d, iteration)

    def _snapshot(self, state: Tensors) -> Tensors:
        """A still copy of ``state``: fresh tensors, or the reused buffer (double
        buffering: the live state and one frozen copy that the writer reads)."""
        if not self._reuse:
            return clone_state(state)
        buf = self._buffer
        for k, v in state.items():
            b = buf.get(k)
            if b is None or b.shape != v.shape or b.dtype != v.dtype:
                buf[k] = v.detach().clone()  # first save, or a table that grew
            else:
                b.copy_(v)
        for k in [k for k in buf if k not in state]:
            del buf[k]
        return dict(buf)

    def write(self, p: Planned) -> CheckpointInfo:
        """Write a planned save; then commit its bookkeeping and prune stale saves."""
        info = self.store.save(p.step, p.tensors, p.meta, tag=p.tag)
        p.commit()
        if p.tag == self.prio_tag:
            live = {int(s) for t in self._owner.values() for s in t.unique()}
            for old in self.store.list(self.prio_tag):
                if old.step not in live:
                    self.store.delete(old)
        return info

    def _partial(self, d: CheckpointDecision, iteration: int) -> Planned | None:
        shard = self.shard
        names = [b.name for b in shard.blocks]
        rowwise = {n: [k for k in shard.opt_state if k.startswith(f"{n}.")] for n in names}
        changes, costs, spans = [], [], []
        for n in names:
            v = shard.values[n]
            width = v[0].numel() * v.element_size() if v.dim() > 1 else v.element_size()
            changes.append(row_change(v, self._ref[n]))
            costs.append(torch.full((v.shape[0],),
                                    float(width * (1 + len(rowwise[n])) + INDEX_BYTES)))
            spans.append(v.shape[0])
        fixed = {k: v for k, v in shard.opt_state.items()
                 if not any(k in ks for ks in rowwise.values())}
        fixed_bytes = sum(v.numel() * v.element_size() for v in fixed.values())
        self._credit += d.fraction * shard.nbytes
        rows, self._cursor = select_rows(torch.cat(changes), torch.cat(costs),
                                         self._credit - fixed_bytes, d.rule, self._cursor,
                                         self._gen)
        if rows.numel() == 0:
            return None  # not enough credit for one row yet: save nothing, keep the credit
        self._credit -= fixed_bytes + float(torch.cat(costs)[rows].sum())
        tensors: Tensors = {}
        chosen: list[tuple[str, torch.Tensor]] = []
        start = 0
        for n, span in zip(names, spans):
            local = rows[(rows >= start) & (rows < start + span)] - start
            start += span
            if local.numel() == 0:
                continue
            tensors[f"rows/{n}"] = local.to(torch.int32)
            tensors[f"value/{n}"] = shard.values[n][local].clone()
            for k in rowwise[n]:
                tensors[f"opt/{k}"] = shard.opt_state[k][local].clone()
            chosen.append((n, local))
        for k, v in fixed.items():
            tensors[f"opt/{k}"] = v.clone()
        self._saves += 1
        save_no = self._saves

        def commit() -> None:
            for n, local in chosen:
                self._ref[n][local] = tensors[f"value/{n}"]
                self._owner[n][local] = save_no

        meta = {"iteration": iteration, "fraction": d.fraction, "version": shard.version,
                "held": {str(w): n for w, n in shard.held.items()}}
        return Planned(self.prio_tag, save_no, tensors, meta, _nbytes(tensors), commit)

    # -- restoring --------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return bool(self.store.list(self.full_tag) or self.store.list(self.prio_tag))

    def restore(self, on_corrupt: OnCorrupt, at_most: int | None = None) -> int | None:
        """Load the freshest saved state (full: the newest valid one with step at most
        ``at_most``); returns its iteration, None when nothing valid was saved (the
        shard then restarts from its initial values)."""
        self.read_bytes = 0
        if self.store.list(self.prio_tag):
            return self._replay(on_corrupt)
        like = {k: None if k == "applied" else v for k, v in self.shard.state_dict().items()}
        for info in reversed(self.store.list(self.full_tag)):
            if at_most is not None and info.step > at_most:
                continue
            try:
                tensors, info = self.store.load(info, tag=self.full_tag, like=like)
            except CheckpointCorrupt as e:
                on_corrupt(str(e))
                continue
            self.shard.load_state_dict(tensors)
            self.read_bytes += info.nbytes
            return info.step
        self.shard.reset(self.x0)
        return None

    def _replay(self, on_corrupt: OnCorrupt) -> int | None:
        """Initial values, then every partial save oldest to newest (a corrupt one is
        reported and skipped: its rows keep an older copy)."""
        self.shard.reset(self.x0)
        newest = None
        for info in self.store.list(self.prio_tag):
            try:
                tensors, info = self.store.load(info, tag=self.prio_tag,
                                                check=require_ints("iteration", "version"))
                self._check(tensors, info.name)
            except CheckpointCorrupt as e:
                on_corrupt(str(e))
                continue
            self._load_rows(tensors, info.step)
            self.read_bytes += info.nbytes
            self.shard.version = int(info.meta["version"])
            self.shard.held = _held(info.meta.get("held"))
            self._saves = max(self._saves, info.step)
            newest = int(info.meta["iteration"])
        return newest

    def _load_rows(self, tensors: Tensors, save_no: int) -> None:
        shard = self.shard
        for n in shard.values:
            rows = tensors.get(f"rows/{n}")
            if rows is None:
                continue
            rows = rows.long()
            opt = {k[len(f"opt/{n}."):]: v for k, v in tensors.items()
                   if k.startswith(f"opt/{n}.")}
            shard.load_rows(n, rows, tensors[f"value/{n}"], opt)
            # The restored rows are what was last saved: bookkeeping follows.
            self._ref[n][rows] = tensors[f"value/{n}"]
            self._owner[n][rows] = save_no
        for k, v in tensors.items():
            if k.startswith("opt/") and "." not in k[4:]:
                shard.opt_state[k[4:]] = v.clone()

    def _check(self, tensors: Tensors, name: str) -> None:
        """A partial save must fit the shard before any of its rows is written back.

        Raises:
            CheckpointCorrupt: naming checkpoint ``name``: an unknown key, or rows,
                values or optimizer state whose dtype, shape or row indices do not fit.
        """
        def bad(what: str) -> CheckpointCorrupt:
            return CheckpointCorrupt(f"checkpoint {name} does not fit the shard: {what}")

        shard = self.shard
        for key, t in tensors.items():
            kind, _, part = key.partition("/")
            if kind not in ("rows", "value", "opt"):
                raise bad(f"unknown key {key}")
            ref = shard.opt_state.get(part) if kind == "opt" else shard.values.get(part)
            owner = (next((n for n in shard.values if part.startswith(f"{n}.")), None)
                     if kind == "opt" else part)  # None: optimizer state of the whole shard
            if ref is None:
                raise bad(f"unknown key {key}")
            rows = tensors.get(f"rows/{owner}")
            if kind == "rows":
                if t.dim() != 1 or t.dtype != torch.int32 or (
                        t.numel() and not 0 <= int(t.min()) <= int(t.max()) < ref.shape[0]):
                    raise bad(f"{key} are not row indices of {part}")
            elif owner is None:
                if t.dtype != ref.dtype or t.shape != ref.shape:
                    raise bad(f"{key} has the wrong dtype or shape")
            elif rows is None or t.dtype != ref.dtype or t.shape != (rows.numel(), *ref.shape[1:]):
                raise bad(f"{key} does not match its rows")


RestoreBatch = Callable[[list[int], int | None], list[int | None]]


def restore_together(restore: RestoreBatch, n: int, prioritized: bool) -> list[int | None]:
    """Restore ``n`` shards so that full checkpoints land on one common step.

    ``restore(indices, at_most)`` restores those shards (the newest valid save with
    step <= ``at_most``; ``at_most=-1``: none, i.e. initial values) and returns their
    steps; the host decides where that runs (in process, or on actors in parallel).
    If a corrupt save made one shard fall back further, the others are restored again
    at that older step; if one has nothing valid, all start over from initial values.
    Prioritized saves are replayed per row, so each shard's own freshest copies stand.
    """
    steps = restore(list(range(n)), None)
    if prioritized:
        return steps
    while None not in steps and len(set(steps)) > 1:
        common = min(s for s in steps if s is not None)
        again = [i for i, s in enumerate(steps) if s != common]
        for i, s in zip(again, restore(again, common)):
            steps[i] = s
    if None in steps and any(s is not None for s in steps):
        restore(list(range(n)), -1)
        steps = [None] * n
    return steps


def _held(saved: object) -> dict[int, int]:
    """A partial save's pushes held per worker (none from a save that did not count them)."""
    try:
        return {int(w): int(n) for w, n in saved.items()} if isinstance(saved, dict) else {}
    except (TypeError, ValueError):
        return {}


def _nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
