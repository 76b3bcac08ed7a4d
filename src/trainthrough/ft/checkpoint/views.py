"""The tensors of a safetensors file read into memory, as views of those bytes.

``safetensors.torch.load(data)`` copies every tensor out of the file's bytes, so a
restore held the file twice (a model's optimizer state: four copies of the model at
once). Here the file is read into one ``bytearray`` and each tensor is a view of its
part of it: the bytes checksummed are the tensors loaded, and a replica that takes
them (``load(..., own=True)``) keeps them as its state.

The format is checked as strictly as safetensors checks it: an 8-byte little-endian
header length, a JSON object of entries ``{"dtype", "shape", "data_offsets"}`` (and an
optional ``__metadata__`` of strings), offsets that tile the data exactly, sizes
that match dtype and shape. Anything else is a ``ValueError``.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
          "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_into(f: Any, limit: int) -> bytearray:
    """At most ``limit + 1`` bytes of the open file ``f`` (enough to tell it is too
    long), read into one buffer without an intermediate copy."""
    buf = bytearray(limit + 1)
    view, got = memoryview(buf), 0
    readinto = getattr(f, "readinto", None)
    while got < len(buf):
        if readinto is not None:
            k = readinto(view[got:])
        else:
            chunk = f.read(len(buf) - got)
            k = len(chunk)
            view[got:got + k] = chunk
        if not k:
            break
        got += k
    view.release()
    del buf[got:]
    return buf


def tensors_of(buf: bytearray) -> Tensors:
    """The tensors of the safetensors file ``buf``, as views of it (no copies).

    Raises:
        ValueError: ``buf`` is not a valid safetensors file (what is wrong).
    """
    if len(buf) < 8:
        raise ValueError("shorter than its header's length")
    (n,) = struct.unpack_from("<Q", buf)
    if n > len(buf) - 8:
        raise ValueError("its header runs past the end")
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    base, size = 8 + n, len(buf) - 8 - n
    out: Tensors = {}
    spans = []
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise ValueError("its __metadata__ is not a map of strings")
            continue
        dtype, shape, (begin, end) = _entry(key, entry)
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = math.prod(shape)
        if not 0 <= begin <= end <= size or end - begin != numel * itemsize:
            raise ValueError(f"tensor {key!r}: offsets [{begin}, {end}) do not hold "
                             f"{dtype} {shape} within {size} bytes")
        spans.append((begin, end))
        if numel == 0:
            out[key] = torch.empty(shape, dtype=dtype)
        elif (base + begin) % itemsize:  # misaligned for its dtype: an aligned copy
            out[key] = torch.frombuffer(buf, dtype=torch.uint8, count=end - begin,
                                        offset=base + begin).clone().view(dtype).view(shape)
        else:
            out[key] = torch.frombuffer(buf, dtype=dtype, count=numel,
                                        offset=base + begin).view(shape)
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            raise ValueError(f"its tensors {'overlap' if begin < at else 'leave a hole'} "
                             f"at byte {min(begin, at)}")
        at = end
    if at != size:
        raise ValueError(f"{size - at} bytes after its last tensor")
    return out


def _entry(key: str, entry: object) -> tuple[torch.dtype, list[int], tuple[int, int]]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"tensor {key!r}: an entry needs exactly dtype, shape, data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise ValueError(f"tensor {key!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"tensor {key!r}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(
            isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise ValueError(f"tensor {key!r}: bad data_offsets {offsets!r}")
    return DTYPES[dtype], shape, (offsets[0], offsets[1])
