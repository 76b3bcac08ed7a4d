"""The checksum of a checkpoint's tensor files: CRC-32 now, sha256 in older manifests.

Why CRC-32 (``zlib.crc32``) and not sha256: the checksum is there to catch accidental
damage (a torn or truncated write, a flipped bit, a file from another checkpoint), and
for that CRC-32 detects every burst of up to 32 bits and any other change but for a
2**-32 chance, at about half sha256's CPU cost (docs/measurements.md). A checkpoint
write is then bounded by the disk, not by the hash, and an asynchronous save takes
less of the core training runs on. Neither checksum stops a
deliberate forgery: whoever can rewrite a file can rewrite the manifest too (its own
checksum included), so a cryptographic hash bought nothing that CRC-32 does not.

Manifests of format ``/2`` (sha256) stay readable and are verified as strictly:
:data:`ALGORITHMS` maps each readable algorithm to its digest length.
"""

from __future__ import annotations

import hashlib
import zlib

#: What a checksum reads: the file's bytes, or a view of a tensor's memory.
Buffer = bytes | bytearray | memoryview

#: Algorithm written by this version.
CURRENT = "crc32"
#: Algorithm name -> hex digits of its digest (every one a reader accepts).
ALGORITHMS = {"crc32": 8, "sha256": 64}


class Crc32:
    """An incremental CRC-32 with the ``update``/``hexdigest`` calls of :mod:`hashlib`.

    ``zlib.crc32`` releases the GIL for buffers over 5 KiB, so a thread can check a
    large file while another writes it.
    """

    def __init__(self, data: Buffer = b"") -> None:
        self._value = zlib.crc32(data)

    def update(self, data: Buffer) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


def digest(algorithm: str, data: Buffer) -> str:
    """Hex digest of ``data`` under ``algorithm`` (a key of :data:`ALGORITHMS`).

    Raises:
        ValueError: an algorithm no manifest may name.
    """
    if algorithm == "crc32":
        return Crc32(data).hexdigest()
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}")
