"""Reading one checkpoint folder as untrusted input: its manifest, then its tensors.

Every problem is an exception naming what is wrong, never a crash of another kind:
:func:`read_manifest` raises :class:`CheckpointCorrupt`; :func:`read_tensors` raises
``ValueError`` (bad content) or ``OSError`` (the filesystem), which the store wraps
with the checkpoint's name. Reads are bounded by the size the manifest allows, so a
file that grew (or a manifest that lies) is never read whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainthrough.errors import CheckpointCorrupt
from trainthrough.ft.checkpoint.checksums import digest
from trainthrough.ft.checkpoint.manifest import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestError,
    parse_manifest,
)
from trainthrough.ft.checkpoint.views import read_into, tensors_of

Tensors = dict[str, torch.Tensor]
#: Expected tensors: exactly these keys; where a tensor is given, its dtype and shape.
Like = Mapping[str, "torch.Tensor | None"]


def read_bounded(fs: Any, path: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``path``: enough to tell it is too long."""
    with fs.open(path, "rb") as f:
        return bytes(f.read(limit + 1))


def entries(fs: Any, path: str) -> list[str]:
    """Names in folder ``path`` (empty if it is missing or not a folder)."""
    fs.invalidate_cache(path)
    try:
        paths = fs.ls(path, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in paths)


def read_manifest(fs: Any, where: str, step: int, tag: str) -> Manifest | None:
    """The validated manifest of checkpoint folder ``where``.

    Returns:
        The manifest, or None if there is none (an interrupted write, or a folder
        deleted meanwhile).

    Raises:
        CheckpointCorrupt: unreadable or invalid manifest, or ``where`` is not a folder.
    """
    try:
        raw = read_bounded(fs, f"{where}/{MANIFEST}", MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        # Some filesystems (memory://) say "not found" for a folder, or below a file.
        if fs.isfile(where):
            raise CheckpointCorrupt(f"checkpoint {where} is corrupt: a file, "
                                    "not a folder") from None
        if fs.isdir(f"{where}/{MANIFEST}"):
            raise CheckpointCorrupt(f"checkpoint {where} is corrupt: {MANIFEST} "
                                    "is a folder") from None
        return None
    except OSError as e:  # NotADirectoryError, IsADirectoryError, PermissionError, I/O
        raise CheckpointCorrupt(f"checkpoint {where} is corrupt: cannot read {MANIFEST} "
                                f"({type(e).__name__}: {e})") from None
    try:
        return parse_manifest(raw, step=step, tag=tag)
    except ManifestError as e:
        raise CheckpointCorrupt(f"checkpoint {where} is corrupt: unreadable {MANIFEST} "
                                f"({e})") from None


def read_tensors(fs: Any, where: str, man: Manifest, like: Like | None) -> Tensors:
    """Read and verify every tensor file ``man`` lists in folder ``where``.

    Checks, in order: the keys ``like`` expects (before reading any file), no files
    the manifest does not list, then per file its size, checksum, safetensors parse and
    keys, and last the dtypes and shapes ``like`` gives.

    Raises:
        ValueError: what is wrong, naming the file or key. OSError: the filesystem failed.
    """
    if like is not None and man.keys != set(like):
        missing, extra = sorted(set(like) - man.keys), sorted(man.keys - set(like))
        what = [f"lacks keys {missing[:5]}"] * bool(missing) + \
            [f"has unexpected keys {extra[:5]}"] * bool(extra)
        raise ValueError(f"{MANIFEST} {' and '.join(what)}")
    unknown = sorted(set(entries(fs, where)) - {f.name for f in man.files} - {MANIFEST})
    if unknown:
        raise ValueError(f"holds files its {MANIFEST} does not list: {unknown[:5]}")
    tensors: Tensors = {}
    for f in man.files:
        try:
            with fs.open(f"{where}/{f.name}", "rb") as opened:
                data = read_into(opened, f.nbytes)
        except FileNotFoundError:
            raise ValueError(f"{f.name} is missing") from None
        if len(data) > f.nbytes:
            raise ValueError(f"{f.name} is longer than the {f.nbytes} bytes the manifest says")
        if len(data) < f.nbytes:
            raise ValueError(f"{f.name} has {len(data)} bytes, manifest says {f.nbytes} "
                             "(truncated?)")
        if digest(f.algorithm, data) != f.digest:
            raise ValueError(f"{f.name} fails its {f.algorithm} check")
        try:  # the tensors are views of the bytes just checked: no second copy
            part = tensors_of(data)
        except Exception as e:  # any parse failure means corrupt
            raise ValueError(f"{f.name} is not valid safetensors ({e})") from None
        if sorted(part) != sorted(f.keys):
            raise ValueError(f"{f.name} holds keys {sorted(part)[:5]}, manifest says "
                             f"{sorted(f.keys)[:5]}")
        tensors.update(part)
    for k, ref in (like or {}).items():
        t = tensors[k]
        if ref is not None and (t.dtype != ref.dtype or t.shape != ref.shape):
            raise ValueError(f"tensor {k} is {t.dtype}{list(t.shape)}, expected "
                             f"{ref.dtype}{list(ref.shape)}")
    return tensors
