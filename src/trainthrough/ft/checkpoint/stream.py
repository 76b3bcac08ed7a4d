"""Write a safetensors file straight from the tensors, checksumming it as it is written.

``safetensors.torch.save`` builds the whole file in memory (two copies of every
tensor) before a byte reaches the disk, and the checksum then reads it a third time.
Here the header is built from the tensors' shapes, each tensor's own memory is
written as is, and a second thread feeds the same buffers to the checksum while the
file is written (both release the GIL), so the write costs about what the disk costs.

The bytes are exactly those ``safetensors.torch.save`` produces (same header, same
order, same padding; a test compares them), so readers and checksums see one format.
The checksum is :class:`~.checksums.Crc32` (see :mod:`.checksums` for why).
"""

from __future__ import annotations

import json
import queue
import struct
import threading
from collections.abc import Callable, Mapping
from typing import IO

import torch

from trainthrough.ft.checkpoint import writeback
from trainthrough.ft.checkpoint.checksums import Crc32

# dtype -> (name in the header, rank): safetensors writes tensors by rank (its dtype
# order, highest first), then by name.
_DTYPES = {torch.int64: ("I64", 9), torch.float64: ("F64", 8), torch.float32: ("F32", 7),
           torch.int32: ("I32", 6), torch.bfloat16: ("BF16", 5), torch.float16: ("F16", 4),
           torch.int16: ("I16", 3), torch.int8: ("I8", 2), torch.uint8: ("U8", 1),
           torch.bool: ("BOOL", 0)}


#: Below this many bytes the file is checksummed on the writing thread (a thread's
#: start costs more than it saves); the threshold was chosen by timing small and
#: medium checkpoints (docs/measurements.md).
PARALLEL_BYTES = 1 << 20


def streamable(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether :func:`write` handles these (CPU, contiguous, a common dtype)."""
    return all(t.dtype in _DTYPES and t.device.type == "cpu" and t.is_contiguous()
               for t in tensors.values())


def _layout(tensors: Mapping[str, torch.Tensor]) -> tuple[bytes, list[str]]:
    """The header (length prefix included) and the order tensors follow it in, as
    safetensors writes them."""
    order = sorted(tensors, key=lambda k: (-_DTYPES[tensors[k].dtype][1], k))
    header: dict[str, object] = {}
    offset = 0
    for k in order:
        t = tensors[k]
        n = t.numel() * t.element_size()
        header[k] = {"dtype": _DTYPES[t.dtype][0], "shape": list(t.shape),
                     "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, order


def _bytes_of(t: torch.Tensor) -> memoryview:
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy().data)  # no copy


def write(f: IO[bytes], tensors: Mapping[str, torch.Tensor]) -> tuple[str, int]:
    """Write ``tensors`` to ``f`` in safetensors format (:func:`streamable` ones).

    Returns:
        (CRC-32 hex digest, bytes written) of the file.
    """
    digest, total = write_deferred(f, tensors)
    return digest(), total


def write_deferred(f: IO[bytes],
                   tensors: Mapping[str, torch.Tensor]) -> tuple[Callable[[], str], int]:
    """:func:`write`, returning as soon as the bytes are written: a large file's
    checksum may still be running on its thread, collected by ``digest()``.

    Why: the disk write plus fsync and the checksum run at comparable speeds, so a
    caller that waited for the checksum before starting the fsync would pay for both
    one after the other; this lets it sync the file while the checksum finishes. The bytes go out in
    :data:`~.writeback.CHUNK` pieces, the disk started on each (:mod:`.writeback`),
    so a local file's fsync finds most of it written already. The tensors must stay
    unchanged until ``digest()`` returns (the checksum reads them).

    Returns:
        (``digest()``: the CRC-32 hex digest, waiting for it; bytes written).
    """
    head, order = _layout(tensors)
    digest = Crc32(head)
    pending: queue.Queue[memoryview | None] = queue.Queue()
    hasher: threading.Thread | None = None
    # Large: a thread hashes while the disk writes. Small: it would cost more than it saves.
    if sum(t.numel() * t.element_size() for t in tensors.values()) >= PARALLEL_BYTES:
        def hash_all() -> None:
            while (buf := pending.get()) is not None:
                digest.update(buf)

        hasher = threading.Thread(target=hash_all, daemon=True, name="checkpoint-crc32")
        hasher.start()
    hash_piece = digest.update if hasher is None else pending.put
    fd = _fileno(f)
    total = unstarted = len(head)
    try:
        f.write(head)
        for k in order:
            buf = _bytes_of(tensors[k])
            for at in range(0, buf.nbytes, writeback.CHUNK):
                piece = buf[at:at + writeback.CHUNK]
                hash_piece(piece)
                f.write(piece)
                total += piece.nbytes
                unstarted += piece.nbytes
                if fd is not None and unstarted >= writeback.CHUNK:  # not for small files
                    f.flush()  # what the writer still buffers, into the page cache
                    writeback.start(fd)
                    unstarted = 0
    except BaseException:
        if hasher is not None:
            pending.put(None)
            hasher.join()
        raise
    if hasher is not None:
        pending.put(None)

    def result() -> str:
        if hasher is not None:
            hasher.join()
        return digest.hexdigest()

    return result, total


def _fileno(f: IO[bytes]) -> int | None:
    """``f``'s descriptor if it is a local file (None for in-memory and remote ones)."""
    try:
        return f.fileno()
    except (OSError, AttributeError, ValueError):  # io.UnsupportedOperation is an OSError
        return None
