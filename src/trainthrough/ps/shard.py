"""One parameter-server shard: its rows, its optimizer state, its version.

This is the only place parameters change. Engines host shards (in-process in
``sim``, as actors in ``ray``) but never reach into them except through this API,
so every engine runs the same update and recovery code.
"""

from __future__ import annotations

import torch

from trainthrough.ps import optim
from trainthrough.ps.layout import RowBlock
from trainthrough.workloads.base import OptimizerSpec

Tensors = dict[str, torch.Tensor]


class Shard:
    """Rows of the model owned by one server, plus the optimizer state for them.

    ``version`` counts applied updates; it is what checkpoints and replicas compare.
    """

    def __init__(self, shard_id: int, blocks: tuple[RowBlock, ...], spec: OptimizerSpec,
                 values: Tensors) -> None:
        self.shard_id = shard_id
        self.blocks = blocks
        self.spec = spec
        self.values: Tensors = {n: v.clone() for n, v in values.items()}
        self.opt_state = optim.init_state(spec, self.values)
        self.version = 0
        # Highest push sequence number applied per worker: Ray may re-deliver a call,
        # and a retried chain write reaches replicas that already have it.
        self.applied: dict[int, int] = {}
        # Pushes this state holds per worker: a count, which sequence numbers are not
        # (a replacement worker starts far above its predecessor); what acknowledged
        # losses are counted against (engines/ray/driver/acknowledged.py).
        self.held: dict[int, int] = {}

    # -- training ---------------------------------------------------------------
    def apply(self, update: Tensors, scale: float = 1.0) -> int:
        """Apply an aggregated update (slices of this shard's rows); return the version."""
        optim.apply(self.spec, self.values, update, self.opt_state, scale)
        self.version += 1
        return self.version

    def apply_aggregate(self, parts: list[Tensors], divide_by: int = 1) -> int:
        """Apply the sum of several workers' slices (divided by ``divide_by``: a mean)
        as one update; the bulk-synchronous round's step. Returns the version."""
        total: Tensors = {}
        for u in parts:
            for n in self.values:
                if n in u:
                    if n in total:
                        total[n].add_(u[n])
                    else:
                        total[n] = u[n].clone()
        if divide_by > 1:
            for t in total.values():
                t.div_(divide_by)
        return self.apply(total) if total else self.version

    def apply_once(self, worker_id: int, seq: int, update: Tensors, scale: float = 1.0) -> bool:
        """Apply a worker's push unless its sequence number was already applied.

        Returns:
            True if applied, False for a duplicate (a re-delivered or retried push).
        """
        if seq <= self.applied.get(worker_id, -1):
            return False
        self.applied[worker_id] = seq
        self.held[worker_id] = self.held.get(worker_id, 0) + 1
        if update:
            self.apply(update, scale)
        else:
            self.version += 1
        return True

    def read(self) -> Tensors:
        """The current values (live tensors: callers that keep them must copy)."""
        return self.values

    # -- state transfer (checkpoints, replicas, recovery) ------------------------
    def state_dict(self) -> Tensors:
        """Values and optimizer state as flat tensors, keys ``value/<name>``, ``opt/<k>``.

        Live tensors, not copies: snapshot with :func:`clone_state` before the next
        update if they must stay still (async persist, replication).
        """
        out = {f"value/{n}": v for n, v in self.values.items()}
        out.update({f"opt/{k}": v for k, v in self.opt_state.items()})
        out["version"] = torch.tensor([self.version], dtype=torch.int64)
        # Per worker: [worker, highest sequence number applied, pushes held].
        out["applied"] = torch.tensor([[w, q, self.held.get(w, 0)]
                                       for w, q in sorted(self.applied.items())]
                                      or [[-1, -1, 0]], dtype=torch.int64).reshape(-1, 3)
        return out

    def load_state_dict(self, state: Tensors) -> None:
        """Replace values, optimizer state and version (copies the tensors)."""
        for n in self.values:
            self.values[n] = state[f"value/{n}"].clone()
        fresh = optim.init_state(self.spec, self.values)
        self.opt_state = {k: state[f"opt/{k}"].clone() if f"opt/{k}" in state else v
                          for k, v in fresh.items()}
        self.version = int(state["version"][0]) if "version" in state else 0
        rows = state["applied"].tolist() if "applied" in state else []
        self.applied = {int(r[0]): int(r[1]) for r in rows if r[0] >= 0}
        # A table of two columns (saved before pushes were counted): none counted.
        self.held = {int(r[0]): int(r[2]) for r in rows if r[0] >= 0 and len(r) > 2}

    def load_rows(self, name: str, rows: torch.Tensor, values: torch.Tensor,
                  opt: Tensors | None = None) -> None:
        """Overwrite some rows (local indices) of one parameter, and their optimizer state."""
        self.values[name][rows] = values
        for k, v in (opt or {}).items():
            self.opt_state[f"{name}.{k}"][rows] = v

    def reset(self, values: Tensors) -> None:
        """Lose everything, as a crashed server does, and start over from ``values``."""
        self.values = {n: v.clone() for n, v in values.items()}
        self.opt_state = optim.init_state(self.spec, self.values)
        self.version = 0
        self.applied = {}
        self.held = {}

    @property
    def nbytes(self) -> int:
        """Bytes of parameters and optimizer state (what a full checkpoint writes)."""
        return sum(v.numel() * v.element_size() for v in self.state_dict().values())


def clone_state(state: Tensors) -> Tensors:
    """A frozen copy of a state dict (for async persists and replica transfer)."""
    return {k: v.detach().clone() for k, v in state.items()}
