"""Reader for the IDX format of MNIST and Fashion-MNIST, plain or gzipped.

IDX is a 4-byte magic number (two zero bytes, a type code, the number of dimensions),
one big-endian uint32 per dimension, then the values in row-major order. Everything is
checked before use, so a truncated download, a swapped images/labels pair or an HTML
error page saved under the right name ends in a :class:`UserError` naming the file.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainthrough.errors import UserError
from trainthrough.workloads._data import require_file

if TYPE_CHECKING:
    import torch

# IDX type code -> numpy big-endian dtype.
_TYPES: dict[int, str] = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4",
                          0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    require_file(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    # Detect gzip from the content, not the name: downloads are often renamed.
    if raw[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise UserError(f"{path}: corrupt gzip data: {e}") from None
    return raw


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (``.gz`` or not) into an array of its stored dtype.

    Args:
        path: the file.
        ndim: the number of dimensions the caller expects (3 for images, 1 for
            labels); checked when given.

    Raises:
        UserError: missing file, bad magic number, unknown type code, wrong number
            of dimensions, or a data section of the wrong length.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise UserError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()!r})")
    dtype, dims = np.dtype(_TYPES[raw[2]]), raw[3]
    if ndim is not None and dims != ndim:
        raise UserError(f"{path}: expected {ndim} dimensions, the file has {dims} "
                        f"(images and labels swapped?)")
    header = 4 + 4 * dims
    if len(raw) < header:
        raise UserError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{dims}I", raw[4:header])
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow on 2**32 dims
    if len(raw) - header != expected:
        raise UserError(f"{path}: header promises shape {shape} ({expected} bytes of data) "
                        f"but the file has {len(raw) - header}")
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as IDX (gzipped when ``path`` ends in ``.gz``); for tests and tools."""
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _TYPES.items()}
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None:
        raise UserError(f"{path}: IDX cannot store dtype {array.dtype}")
    body = struct.pack(f">BBBB{array.ndim}I", 0, 0, code, array.ndim, *array.shape)
    body += array.astype(_TYPES[code]).tobytes()
    path = Path(path)
    path.write_bytes(gzip.compress(body, mtime=0) if path.suffix == ".gz" else body)


def load_idx_pair(images: str | Path, labels: str | Path, square: bool = False,
                  min_side: int = 1, why: str = "the model"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Images scaled to [0, 1] as N x 1 x H x W, and labels 0..9, checked against each
    other (MNIST's and Fashion-MNIST's layout).

    Args:
        images, labels: the two IDX files (3 and 1 dimensions).
        square, min_side: what ``why`` (named in the error) needs of the images.

    Raises:
        UserError: naming the file: counts that differ, images of the wrong shape,
            non-finite pixels, labels that are not whole numbers in 0..9.
    """
    import torch

    x = read_idx(images, ndim=3)
    y = read_idx(labels, ndim=1)
    if len(x) != len(y):
        raise UserError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    if square and x.shape[1] != x.shape[2]:
        raise UserError(f"{images}: expected square images, got {x.shape[1]}x{x.shape[2]}")
    if min(x.shape[1], x.shape[2]) < min_side:
        raise UserError(f"{images}: images are {x.shape[1]}x{x.shape[2]}; {why} "
                        f"needs at least {min_side}x{min_side}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise UserError(f"{images}: pixel values must be finite numbers")
    if y.dtype.kind not in "iu":
        raise UserError(f"{labels}: labels must be whole numbers, the file stores {y.dtype}")
    if y.size and (y.min() < 0 or y.max() > 9):
        raise UserError(f"{labels}: labels must be 0..9, found {y.min()}..{y.max()}")
    xt = torch.from_numpy(x.astype("float32") / 255.0).unsqueeze(1)
    return xt, torch.from_numpy(y.astype("int64"))
