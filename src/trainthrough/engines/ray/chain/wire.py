"""How forwards travel between chain replicas (pushes, or a whole state).

Over a link's socket (:mod:`~trainthrough.engines.ray.chain.link_socket`, the usual path) a
forward is a JSON header naming every tensor (name, dtype, shape) followed by the
tensors' raw bytes: :func:`frame_items`, :func:`frame_state` and
:func:`from_frame`. Never pickle: a frame can only ever become tensors of the dtypes
in ``DTYPES``.

Over a Ray call (only for tensors of other dtypes: none of the built-in workloads)
a forward goes as it is, pickled by Ray.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple, cast

import numpy as np
import torch


class Item(NamedTuple):
    """One worker's push, as a chain applies and forwards it."""

    worker: int
    seq: int  #: the worker's sequence number (the shard's dedup key)
    update: dict[str, torch.Tensor]  #: the shard's slice of the update
    scale: float  #: applied as ``update * scale``


def nbytes(item: Item) -> int:
    """The bytes of a push's tensors."""
    return sum(t.numel() * t.element_size() for t in item.update.values())


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    """A replica's whole state: what a forward carries when it is smaller than the pushes."""
    return sum(t.numel() * t.element_size() for t in state.values())


# -- frames: what a link's socket carries (a JSON header, then raw tensor bytes) ------
#: dtypes a frame may carry (by name in the header); anything else goes by Ray call.
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)}
_ALIGN = 8  # every tensor starts 8-byte aligned in the payload
_NAMES = {d: n for n, d in DTYPES.items()}
_NUMPY = frozenset(DTYPES.values()) - {torch.bfloat16}  # dtypes numpy has too


def framable(tensors: list[torch.Tensor]) -> bool:
    return all(t.dtype in DTYPES.values() for t in tensors)


def frame_items(gen: int, first: int, items: list[Item]) -> tuple[dict[str, Any],
                                                                   list[torch.Tensor]]:
    """A forward of pushes at chain positions ``first`` on: header and tensors."""
    header: dict[str, Any] = {"op": "push", "gen": gen, "pos": first, "items": []}
    tensors: list[torch.Tensor] = []
    for worker, seq, update, scale in items:
        header["items"].append([worker, seq, scale, list(update)])
        tensors += update.values()
    return header, tensors


def frame_state(gen: int, pos: int, state: dict[str, torch.Tensor]
                ) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A forward of a whole state at chain position ``pos``: header and tensors."""
    return {"op": "state", "gen": gen, "pos": pos, "names": list(state)}, list(state.values())


def describe(header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[bytes, list[Any]]:
    """The header as JSON (with each tensor's dtype, shape and offset) and the
    buffers to send after it (the tensors' own memory: no copy when contiguous)."""
    layout: list[list[Any]] = []
    buffers: list[Any] = []
    at = 0
    for t in tensors:
        t = t.detach()
        # A contiguous tensor of a numpy dtype is sent from its own memory as it is
        # (one call, ~2 us); anything else as bytes (five calls, ~7 us: a forward
        # carries eight tensors a push, twice down a chain of three).
        raw = (t.numpy() if t.is_contiguous() and t.dtype in _NUMPY and t.numel()
               else t.contiguous().reshape(-1).view(torch.uint8).numpy())
        pad = -at % _ALIGN
        if pad:
            buffers.append(bytes(pad))
        at += pad
        layout.append([_NAMES[t.dtype], list(t.shape), at])
        buffers.append(raw)
        at += raw.nbytes
    return json.dumps({**header, "tensors": layout}).encode(), buffers


def from_frame(header: dict[str, Any], payload: np.ndarray) -> tuple[str, int, int, Any]:
    """(op, generation, position, items or state) from a received frame; the tensors
    are views into ``payload`` (a fresh buffer per frame: they outlive the call).

    Raises:
        ValueError, KeyError, TypeError: a malformed frame (the link drops it).
    """
    tensors = []
    for dtype, shape, at in header["tensors"]:
        if not all(isinstance(n, int) and n >= 0 for n in shape) or at % _ALIGN:
            raise ValueError(f"bad tensor layout {shape} at {at}")
        count = math.prod(shape)
        t = torch.frombuffer(cast(Any, payload), dtype=DTYPES[dtype], count=count,
                             offset=at) if count else torch.zeros(0, dtype=DTYPES[dtype])
        tensors.append(t.view(shape))
    op, gen, pos = str(header["op"]), int(header["gen"]), int(header["pos"])
    if op == "state":
        names = [str(n) for n in header["names"]]
        if len(names) != len(tensors):
            raise ValueError("state names and tensors differ in number")
        return op, gen, pos, dict(zip(names, tensors))
    if op != "push":
        raise ValueError(f"unknown op {op!r}")
    items: list[Item] = []
    at = 0
    for worker, seq, scale, names in header["items"]:
        update = {str(n): tensors[at + k] for k, n in enumerate(names)}
        at += len(names)
        items.append(Item(int(worker), int(seq), update, float(scale)))
    if at != len(tensors):
        raise ValueError("items and tensors differ in number")
    return op, gen, pos, items
