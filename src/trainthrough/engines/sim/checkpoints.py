"""Taking and restoring checkpoints in the simulated cluster, sync or in the background.

Sync: training blocks while the state is written (storage time is charged as
blocked time). Async: training blocks only for an in-memory snapshot; the persist
finishes ``bytes / storage_bandwidth`` simulated seconds later, and only then does
the checkpoint exist. A second persist never overlaps the first (it waits, and the
wait is charged as blocked), and a failure abandons a persist still in flight, so
recovery never sees a checkpoint that was not complete before the crash.

Full checkpoints (fraction 1) hold every shard's whole state under tag ``ckpt``.
Prioritized ones (fraction r < 1, SCAR) hold, per shard, the rows picked by
:func:`~trainthrough.ft.prioritized.select_rows` under tag ``prio``, numbered by a
save counter (not the iteration, which a rollback can rewind); recovery replays
them oldest to newest so each row gets its freshest saved copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.cluster import SimCluster
from trainthrough.engines.sim.persist import Persister
from trainthrough.errors import CheckpointCorrupt
from trainthrough.ft.checkpoint import require_ints
from trainthrough.ft.checkpointing import CheckpointPolicy
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.prioritized import INDEX_BYTES, row_change, select_rows

Tensors = dict[str, torch.Tensor]


class SimCheckpointer:
    """Carries out the checkpoint policy's decisions, and restores from what it saved."""

    def __init__(self, cluster: SimCluster, policy: CheckpointPolicy, clock: VirtualClock,
                 costs: Costs, emit: Callable[[dict[str, Any]], None], seed: int = 0) -> None:
        self.c = cluster
        self.policy = policy
        self.clock = clock
        self.costs = costs
        self.emit = emit
        self.count = 0
        self.bytes = 0  # everything written: tensors, safetensors headers, manifests
        self.payload_bytes = 0  # tensor data only (values, optimizer state, row indices)
        self.persist = Persister(clock, costs)
        # Prioritized bookkeeping, per shard: the values as last saved, the save that
        # holds each row's freshest copy (-1: never saved, i.e. initial values).
        self._ref = [{n: v.clone() for n, v in p.items()} for p in cluster.x0_parts]
        self._owner = [{n: torch.full((v.shape[0],), -1, dtype=torch.int64)
                        for n, v in p.items()} for p in cluster.x0_parts]
        self._cursor = [0] * len(cluster.shards)
        self._credit = [0.0] * len(cluster.shards)  # bytes each shard may still write
        self._gen = torch.Generator().manual_seed(seed + 31)
        self._saves = 0

    # -- saving -----------------------------------------------------------------
    @property
    def blocked(self) -> float:
        return self.persist.blocked

    def flush_due(self) -> None:
        """Complete a background persist whose simulated write has finished."""
        self.persist.flush_due()

    def after_iteration(self, logical: int) -> None:
        """Finish a persist that is due, then ask the policy whether to save now."""
        self.flush_due()
        decision = self.policy.decide(logical)
        if decision is None or self.c.store is None:
            return
        if decision.fraction >= 1.0:
            tensors, commit = self.c.state_tensors(), (lambda: None)
            tag, step, meta = "ckpt", logical, self._meta()
        else:
            tensors, commit = self._partial(decision)
            if not tensors:
                return  # no shard has credit for a row yet
            self._saves += 1
            tag, step = "prio", self._saves
            meta = {"iteration": logical, "fraction": decision.fraction,
                    "versions": [sh.version for sh in self.c.shards]}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())

        def finish(blocked: float = 0.0) -> None:
            info = self.c.store.save(step, tensors, meta, tag=tag)  # type: ignore[union-attr]
            commit()
            self.count += 1
            self.bytes += info.nbytes
            self.payload_bytes += nbytes
            self.emit({"type": "checkpoint", "iteration": logical, "bytes": info.nbytes,
                       "blocked_seconds": blocked, "async": decision.asynchronous,
                       "fraction": decision.fraction, "name": info.name})
            if tag == "prio":
                self._prune()

        self.persist.write(nbytes, decision.asynchronous, finish)

    def drop_pending(self) -> None:
        """A failure struck: a persist still in flight never completes."""
        if self.persist.drop():
            self.emit({"type": "checkpoint-abandoned"})

    def _meta(self) -> dict[str, Any]:
        return {"layout": self.c.layout.to_dict(), "workload": self.c.workload.name}

    def _partial(self, d: CheckpointDecision) -> tuple[Tensors, Callable[[], None]]:
        """Pick each shard's rows; return the payload and the bookkeeping to commit."""
        tensors: Tensors = {}
        chosen: list[tuple[int, str, torch.Tensor]] = []
        for i, shard in enumerate(self.c.shards):
            names = [b.name for b in shard.blocks]
            rowwise = {n: [k for k in shard.opt_state if k.startswith(f"{n}.")] for n in names}
            changes, costs, spans = [], [], []
            for n in names:
                v = shard.values[n]
                width = v[0].numel() * v.element_size() if v.dim() > 1 else v.element_size()
                changes.append(row_change(v, self._ref[i][n]))
                costs.append(torch.full((v.shape[0],),
                                        float(width * (1 + len(rowwise[n])) + INDEX_BYTES)))
                spans.append(v.shape[0])
            fixed = {k: v for k, v in shard.opt_state.items()
                     if not any(k in ks for ks in rowwise.values())}
            fixed_bytes = sum(v.numel() * v.element_size() for v in fixed.values())
            self._credit[i] += d.fraction * shard.nbytes
            rows, self._cursor[i] = select_rows(
                torch.cat(changes), torch.cat(costs), self._credit[i] - fixed_bytes, d.rule,
                self._cursor[i], self._gen)
            if rows.numel() == 0:
                continue  # not enough credit for one row yet: save nothing, keep the credit
            self._credit[i] -= fixed_bytes + float(torch.cat(costs)[rows].sum())
            start = 0
            for n, span in zip(names, spans):
                local = rows[(rows >= start) & (rows < start + span)] - start
                start += span
                if local.numel() == 0:
                    continue
                tensors[f"shard{i}/rows/{n}"] = local.to(torch.int32)
                tensors[f"shard{i}/value/{n}"] = shard.values[n][local].clone()
                for k in rowwise[n]:
                    tensors[f"shard{i}/opt/{k}"] = shard.opt_state[k][local].clone()
                chosen.append((i, n, local))
            for k, v in fixed.items():
                tensors[f"shard{i}/opt/{k}"] = v.clone()
        save_no = self._saves + 1

        def commit() -> None:
            for i, n, local in chosen:
                self._ref[i][n][local] = tensors[f"shard{i}/value/{n}"]
                self._owner[i][n][local] = save_no

        return tensors, commit

    def _prune(self) -> None:
        """Delete partial checkpoints that no longer hold any row's freshest copy."""
        live = {int(s) for owners in self._owner for t in owners.values() for s in t.unique()}
        for info in self.c.store.list("prio"):  # type: ignore[union-attr]
            if info.step not in live:
                self.c.store.delete(info)  # type: ignore[union-attr]

    # -- restoring --------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.c.store is not None and bool(self.c.store.list() or self.c.store.list("prio"))

    def restore(self, shard_ids: list[int], on_corrupt: Callable[[str], None]) -> int | None:
        """Load ``shard_ids`` from the freshest saved state; return its iteration.

        Full checkpoint: the latest valid one. Prioritized: start from the initial
        values and replay every partial save oldest to newest (a corrupt one is
        reported and skipped: its rows keep an older copy). Charges read time.
        Returns None when nothing was saved yet (the shards are re-initialized).
        """
        store = self.c.store
        if store is None:
            return None
        if store.list("prio"):
            for i in shard_ids:
                self.c.reinit(i)
            newest = None
            for info in store.list("prio"):
                try:
                    tensors, info = store.load(info, tag="prio", check=self._prio_meta)
                    self._check_prio(tensors, info.name)
                except CheckpointCorrupt as e:  # its rows keep an older copy
                    on_corrupt(str(e))
                    continue
                self.clock.advance(self.costs.storage(info.nbytes))
                for i in shard_ids:
                    self._load_rows(i, tensors)
                    if f"shard{i}/rows/" in "".join(tensors):
                        self.c.shards[i].version = int(info.meta["versions"][i])
                newest = int(info.meta.get("iteration", 0))
            return newest
        # Exactly the cluster's state keys, shapes and dtypes (the table of applied
        # pushes grows, so only its presence is required).
        like = {k: None if k.endswith("/applied") else v
                for k, v in self.c.state_tensors().items()}
        ckpt = store.load_latest(on_corrupt=on_corrupt, like=like)
        if ckpt is None:
            for i in shard_ids:
                self.c.reinit(i)
            return None
        tensors, info = ckpt
        self.clock.advance(self.costs.storage(info.nbytes))
        for i in shard_ids:
            self.c.load_shard(i, tensors)
        return info.step

    def _prio_meta(self, meta: dict[str, Any]) -> None:
        require_ints("iteration")(meta)
        v = meta.get("versions")
        if not isinstance(v, list) or len(v) != len(self.c.shards) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
            raise ValueError("versions is not one non-negative integer per shard")

    def _check_prio(self, tensors: Tensors, name: str) -> None:
        """A partial save must fit the shards before any of its rows is written back.

        Raises:
            CheckpointCorrupt: naming checkpoint ``name``: an unknown key, or rows,
                values or optimizer state whose dtype, shape or row indices do not fit.
        """
        def bad(what: str) -> CheckpointCorrupt:
            return CheckpointCorrupt(f"checkpoint {name} does not fit the shards: {what}")

        ids = {f"shard{i}": i for i in range(len(self.c.shards))}
        for key, t in tensors.items():
            head, _, rest = key.partition("/")
            kind, _, part = rest.partition("/")
            if head not in ids or kind not in ("rows", "value", "opt"):
                raise bad(f"unknown key {key}")
            shard = self.c.shards[ids[head]]
            ref = shard.opt_state.get(part) if kind == "opt" else shard.values.get(part)
            owner = (next((n for n in shard.values if part.startswith(f"{n}.")), None)
                     if kind == "opt" else part)  # None: optimizer state of the whole shard
            if ref is None:
                raise bad(f"unknown key {key}")
            rows = tensors.get(f"{head}/rows/{owner}")
            if kind == "rows":
                if t.dim() != 1 or t.dtype != torch.int32 or (
                        t.numel() and not 0 <= int(t.min()) <= int(t.max()) < ref.shape[0]):
                    raise bad(f"{key} are not row indices of {part}")
            elif owner is None:
                if t.dtype != ref.dtype or t.shape != ref.shape:
                    raise bad(f"{key} has the wrong dtype or shape")
            elif rows is None or t.dtype != ref.dtype or t.shape != (rows.numel(), *ref.shape[1:]):
                raise bad(f"{key} does not match its rows")

    def _load_rows(self, i: int, tensors: Tensors) -> None:
        shard = self.c.shards[i]
        p = f"shard{i}/"
        for n in shard.values:
            rows = tensors.get(f"{p}rows/{n}")
            if rows is None:
                continue
            rows = rows.long()
            opt = {k[len(p) + 4 + len(n) + 1:]: v for k, v in tensors.items()
                   if k.startswith(f"{p}opt/{n}.")}
            shard.load_rows(n, rows, tensors[f"{p}value/{n}"], opt)
        for k, v in tensors.items():
            if k.startswith(f"{p}opt/") and "." not in k[len(p) + 4:]:
                shard.opt_state[k[len(p) + 4:]] = v.clone()
