"""How parameters map onto shards: contiguous row ranges of a global row space.

Every parameter tensor is viewed as rows along its first dimension (a 1-D tensor
has one row per element); the rows of all parameters, in name order, form one key
space that is cut into K contiguous ranges of near-equal element count. A shard
therefore owns, for each parameter, at most one contiguous block of rows, so its
slices are views and splitting or assembling parameters costs no copies beyond
a ``torch.cat``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainthrough.errors import UserError

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class RowBlock:
    """Rows ``start:stop`` of parameter ``name``."""

    name: str
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Layout:
    """The shard map: for each shard, the row blocks it owns."""

    shapes: dict[str, tuple[int, ...]]
    shards: tuple[tuple[RowBlock, ...], ...]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def total_rows(self) -> int:
        return sum(s[0] for s in self.shapes.values())

    def row_width(self, name: str) -> int:
        """Elements per row of parameter ``name``."""
        shape = self.shapes[name]
        width = 1
        for d in shape[1:]:
            width *= d
        return width

    def split(self, params: Params) -> list[Params]:
        """Cut full parameters into per-shard slices (views, no copy)."""
        return [{b.name: params[b.name][b.start:b.stop] for b in blocks}
                for blocks in self.shards]

    def split_partial(self, params: Params) -> list[Params]:
        """Like :meth:`split` for an update that touches only some parameters."""
        return [{b.name: params[b.name][b.start:b.stop] for b in blocks if b.name in params}
                for blocks in self.shards]

    def assemble(self, parts: list[Params]) -> Params:
        """Inverse of :meth:`split`: concatenate shard slices into full tensors."""
        pieces: dict[str, list[torch.Tensor]] = {n: [] for n in self.shapes}
        for blocks, part in zip(self.shards, parts):
            for b in blocks:
                pieces[b.name].append(part[b.name])
        return {n: (p[0] if len(p) == 1 else torch.cat(p)) for n, p in pieces.items()}

    def rows_mask(self, shard_ids: tuple[int, ...]) -> Params:
        """Boolean masks over the full parameters marking the rows of ``shard_ids``."""
        masks = {n: torch.zeros(s[0], dtype=torch.bool) for n, s in self.shapes.items()}
        for i in shard_ids:
            for b in self.shards[i]:
                masks[b.name][b.start:b.stop] = True
        return masks

    def to_dict(self) -> dict[str, object]:
        """JSON-able form, written into checkpoint manifests."""
        return {"shapes": {n: list(s) for n, s in self.shapes.items()},
                "shards": [[[b.name, b.start, b.stop] for b in s] for s in self.shards]}


def make_layout(params: Params, num_shards: int) -> Layout:
    """Cut ``params`` into ``num_shards`` contiguous row ranges of similar size.

    Raises:
        UserError: if ``num_shards`` < 1 or exceeds the number of rows.
    """
    names = sorted(params)
    shapes = {n: tuple(params[n].shape) if params[n].dim() else (1,) for n in names}
    rows = [(n, r) for n in names for r in range(shapes[n][0])]
    if num_shards < 1:
        raise UserError(f"shards must be at least 1 (got {num_shards})")
    if num_shards > len(rows):
        raise UserError(f"{num_shards} shards but the parameters have only {len(rows)} "
                        f"rows; use at most {len(rows)} shards")
    widths = {n: max(1, params[n][0].numel()) if params[n].dim() else 1 for n in names}
    total = sum(widths[n] for n, _ in rows)
    # Greedy cut at the row where the running element count crosses k/K of the total,
    # but never leave a later shard without rows.
    cuts, acc, k = [0], 0, 1
    for i, (n, _) in enumerate(rows):
        acc += widths[n]
        remaining_rows = len(rows) - (i + 1)
        if k < num_shards and (acc >= total * k / num_shards
                               or remaining_rows == num_shards - k):
            cuts.append(i + 1)
            k += 1
    cuts.append(len(rows))
    shards = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        blocks: list[RowBlock] = []
        for n, r in rows[a:b]:
            if blocks and blocks[-1].name == n:
                blocks[-1] = RowBlock(n, blocks[-1].start, r + 1)
            else:
                blocks.append(RowBlock(n, r, r + 1))
        shards.append(tuple(blocks))
    return Layout(shapes=shapes, shards=tuple(shards))
