"""How forwards travel between chain replicas (pushes, or a whole state): flat
float32 chunks.

Two costs of Ray calls decide the form. A dict of tensors is pickled tensor by tensor
(~1.6 ms for cnn's eight, more than applying the update), while a numpy array takes
Ray's zero-copy path. And an argument above Ray's inline limit (100 KB by default)
goes through the object store (raylet, shared memory, a fetch by the receiver): a batch
of pushes sent as one array would take that slow path as soon as it held two cnn
updates. So a batch travels as its shapes plus the concatenated values cut into
chunks well under the limit, each its own argument: one call, all inline.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

Item = tuple[int, int, Any, float]  # worker, sequence number, update, scale
Meta = list[tuple[int, int, float, list[tuple[str, tuple[int, ...]]]]]
CHUNK_FLOATS = 16384  # 64 KiB per argument: inline in the call
#: Most bytes one forward call carries (Ray inlines up to 10 MB of arguments per call).
CALL_BYTES = 4 << 20


def nbytes(item: Item) -> int:
    return sum(t.numel() * t.element_size() for t in item[2].values())


def packable(items: list[Item]) -> bool:
    return all(t.dtype == torch.float32 for it in items for t in it[2].values())


def pack(items: list[Item]) -> tuple[Meta, list[np.ndarray]]:
    """Shapes of every push and their values as chunks (:func:`packable` items)."""
    parts, meta = [], []
    for worker, seq, update, scale in items:
        meta.append((worker, seq, scale, [(n, tuple(t.shape)) for n, t in update.items()]))
        parts += [t.reshape(-1) for t in update.values()]
    flat = (torch.cat(parts) if parts else torch.zeros(0)).numpy()
    return meta, [flat[i:i + CHUNK_FLOATS] for i in range(0, max(len(flat), 1), CHUNK_FLOATS)]


def unpack(meta: Meta, chunks: tuple[np.ndarray, ...]) -> list[Item]:
    # One copy: Ray hands out read-only arrays, and the updates must outlive the call.
    flat = torch.from_numpy(np.concatenate(chunks) if chunks else np.zeros(0, np.float32))
    items: list[Item] = []
    at = 0
    for worker, seq, scale, shapes in meta:
        update = {}
        for n, shape in shapes:
            size = math.prod(shape)
            update[n] = flat[at:at + size].view(shape)
            at += size
        items.append((worker, seq, update, scale))
    return items


# -- a replica's whole state: what a forward carries when it is smaller than the pushes
StateMeta = tuple[list[tuple[str, tuple[int, ...]]], dict[str, np.ndarray]]


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def packable_state(state: dict[str, torch.Tensor]) -> bool:
    return all(t.dtype in (torch.float32, torch.int64) for t in state.values())


def pack_state(state: dict[str, torch.Tensor]) -> tuple[StateMeta, list[np.ndarray]]:
    """A shard's state dict as chunks: the float32 tensors (values, optimizer state)
    concatenated, the rest (version, dedup table: a few integers) as small arrays.
    The concatenation is a copy: the result stays still while the shard moves on."""
    floats = [(n, t) for n, t in state.items() if t.dtype == torch.float32]
    others = {n: t.numpy().copy() for n, t in state.items() if t.dtype != torch.float32}
    flat = (torch.cat([t.reshape(-1) for _, t in floats]) if floats
            else torch.zeros(0)).numpy()
    shapes = [(n, tuple(t.shape)) for n, t in floats]
    return (shapes, others), [flat[i:i + CHUNK_FLOATS]
                              for i in range(0, max(len(flat), 1), CHUNK_FLOATS)]


def unpack_state(meta: StateMeta, chunks: tuple[np.ndarray, ...]) -> dict[str, torch.Tensor]:
    """The state dict :func:`pack_state` packed (views into one fresh copy)."""
    shapes, others = meta
    flat = torch.from_numpy(np.concatenate(chunks) if chunks else np.zeros(0, np.float32))
    state, at = {}, 0
    for n, shape in shapes:
        size = math.prod(shape)
        state[n] = flat[at:at + size].view(shape)
        at += size
    state.update({n: torch.from_numpy(a.copy()) for n, a in others.items()})
    return state
