"""A replica's state copied to host memory for a background write (checkpoint-async).

A checkpoint is written from host memory (safetensors reads CPU tensors), so a CUDA
replica's state must come off the device first. :class:`HostSnapshot` copies it into
pinned buffers it keeps from one save to the next, without blocking (``non_blocking``
on a side stream that first waits for the training stream, so it copies what the
step left), and the writer waits on the copy's event, not the training loop. On the
CPU the state's own copies are the snapshot.

Call order: :meth:`HostSnapshot.take` once per save, the returned
:class:`Snapshot`'s :meth:`~Snapshot.tensors` in the writer; the next ``take`` only
after that write finished (its buffers are reused: one write in flight at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensors = dict[str, torch.Tensor]


@dataclass
class Snapshot:
    """Host tensors, ready once :attr:`ready` (a CUDA event) has completed."""

    host: Tensors
    ready: torch.cuda.Event | None = None

    def tensors(self) -> Tensors:
        """The host copies, waiting for the device copy to finish if one is running."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host


class HostSnapshot:
    """Reused pinned host buffers (by key) and a copy stream per device."""

    def __init__(self) -> None:
        self._buffers: Tensors = {}
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def take(self, state: Tensors) -> Snapshot:
        """Start copying ``state`` (tensors the caller no longer changes: a replica's
        ``state()`` copies) to host memory; CPU tensors are used as they are."""
        cuda = {t.device for t in state.values() if t.device.type == "cuda"}
        if not cuda:
            return Snapshot(dict(state))
        if len(cuda) > 1:  # one replica lives on one device; several: copy in order
            return Snapshot({k: v.cpu() for k, v in state.items()})
        device = cuda.pop()
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))  # the step's writes first
        out: Tensors = {}
        with torch.cuda.stream(stream):
            for k, t in state.items():
                if t.device.type != "cuda":
                    out[k] = t
                    continue
                buf = self._buffer(k, t)
                buf.copy_(t, non_blocking=True)
                t.record_stream(stream)  # its memory is not reused before the copy ends
                out[k] = buf
            ready = torch.cuda.Event()
            ready.record(stream)
        return Snapshot(out, ready)

    def _buffer(self, key: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = self._buffers[key] = torch.empty(like.shape, dtype=like.dtype,
                                                   pin_memory=True)
        return buf
