"""The simulated parameter server: shards, workers and the checkpoint store in one process.

It owns the objects and carries out decisions; which decision to take comes from
the strategy's policies. Failures here are flags: a failed shard's state is wiped
exactly as a crashed process would lose it.
"""

from __future__ import annotations

import torch

from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ps.layout import Layout
from trainthrough.ps.shard import Shard, clone_state
from trainthrough.ps.worker import Worker
from trainthrough.workloads.base import Params, Workload


class SimCluster:
    """K shards and N workers of one run, plus the checkpoint store."""

    def __init__(self, workload: Workload, layout: Layout, x0: Params, shards: list[Shard],
                 workers: list[Worker], store: CheckpointStore | None) -> None:
        self.workload = workload
        self.layout = layout
        self.x0_parts = [{n: v.clone() for n, v in p.items()} for p in layout.split(x0)]
        self.shards = shards
        self.workers = workers
        self.store = store
        self.param_bytes = sum(v.numel() * v.element_size() for v in x0.values())
        self.worker_incarnations = [0] * len(workers)
        # Worker-copy recovery: every pull is kept by the workers that made it. Off
        # otherwise, so other strategies pay nothing for it.
        self.keep_copies = False

    # -- reading ----------------------------------------------------------------
    def params(self) -> Params:
        """The full current parameters (views where a parameter lives on one shard)."""
        return self.layout.assemble([s.read() for s in self.shards])

    def snapshot(self) -> Params:
        """A frozen copy of the full parameters."""
        return {n: v.clone() for n, v in self.params().items()}

    def shard_rows_mask(self, shard_ids: tuple[int, ...]) -> Params:
        """Boolean masks over the full parameters marking the rows of ``shard_ids``."""
        return self.layout.rows_mask(shard_ids)

    # -- the bulk-synchronous round (ps/round.py's host) --------------------------
    def pull(self) -> Params:
        """The round's pull; every worker keeps it when worker copies are on (one frozen
        copy in this process stands for the one each worker holds in a deployment)."""
        if not self.keep_copies:
            return self.params()
        params, versions = self.snapshot(), self.versions()
        for wk in self.workers:
            wk.keep(params, versions)
        return params

    def pull_for(self, w: int) -> Params:
        """Worker ``w``'s own pull (bounded staleness), kept when copies are on."""
        if not self.keep_copies:
            return self.params()
        params = self.snapshot()
        self.workers[w].keep(params, self.versions())
        return params

    def versions(self) -> tuple[int, ...]:
        return tuple(s.version for s in self.shards)

    def compute(self, step: int, params: Params) -> list[list[Params]]:
        parts = [self.layout.split_partial(wk.compute(params, step)) for wk in self.workers]
        if self.keep_copies:
            for wk, p in zip(self.workers, parts):
                wk.keep_push(p)
        return parts

    def apply_parts(self, step: int, parts: list[list[Params]], divide_by: int) -> bool:
        for shard, p in zip(self.shards, parts):
            shard.apply_aggregate(p, divide_by)
        return True

    # -- applying ---------------------------------------------------------------
    def apply(self, update: Params, scale: float = 1.0) -> None:
        """Split an aggregated update over the shards and let each apply its part."""
        for shard, blocks in zip(self.shards, self.layout.shards):
            part = {b.name: update[b.name][b.start:b.stop] for b in blocks if b.name in update}
            if part:
                shard.apply(part, scale)

    # -- state ------------------------------------------------------------------
    def state_tensors(self, shard_ids: list[int] | None = None) -> dict[str, torch.Tensor]:
        """Checkpoint payload: ``shard<i>/<key>`` for each shard's state (copies)."""
        ids = range(len(self.shards)) if shard_ids is None else shard_ids
        out: dict[str, torch.Tensor] = {}
        for i in ids:
            for k, v in clone_state(self.shards[i].state_dict()).items():
                out[f"shard{i}/{k}"] = v
        return out

    def load_shard(self, i: int, tensors: dict[str, torch.Tensor]) -> None:
        prefix = f"shard{i}/"
        self.shards[i].load_state_dict({k[len(prefix):]: v for k, v in tensors.items()
                                        if k.startswith(prefix)})

    def wipe(self, i: int) -> None:
        """Shard ``i`` crashes: its values, optimizer state and version are gone."""
        self.shards[i].reset({n: torch.full_like(v, float("nan"))
                              for n, v in self.x0_parts[i].items()})

    def reinit(self, i: int) -> None:
        self.shards[i].reset(self.x0_parts[i])

    def restart_worker(self, w: int) -> None:
        self.worker_incarnations[w] += 1
        self.workers[w].start(self.params(), self.worker_incarnations[w])
