"""Crash-consistent checkpoint store on a local path or any fsspec URL.

Layout: one checkpoint is one folder ``<url>/<tag>-<step:08d>/`` holding one or more
safetensors files (tensors grouped by the key prefix before the first ``/``) and a
``manifest.json`` listing every file with its size, sha256 and keys.

Crash consistency rests on three rules:

* Everything is written into a private temp folder ``<tag>-<step>.tmp-<hex>/`` and the
  manifest is written LAST, so its existence means the checkpoint is complete. The
  finished folder is then renamed to its final name. A writer that dies at any point
  leaves either nothing under the final name or a complete checkpoint; :meth:`list`
  ignores temp folders and folders without a manifest, and the next successful save of
  the same tag removes the leftovers.
* Old checkpoints are pruned only after the new one is complete and renamed, and a pruned
  checkpoint loses its manifest first, so a half-deleted folder is never listed.
* Every tensor file is verified (size, sha256, parseable, expected keys) before use;
  :meth:`CheckpointStore.load_latest` skips a checkpoint that fails and falls back to the
  previous one. Nothing is ever unpickled: tensors go through ``safetensors`` bytes APIs.

One writer per (location, tag) is assumed; several threads of one process may share a store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import safetensors.torch
import torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from trainthrough.errors import CheckpointCorrupt

FORMAT = "trainthrough-checkpoint/1"
MANIFEST = "manifest.json"
ROOT_FILE = "root"  # file stem for keys without a "/" prefix
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.safetensors$")


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint as listed by (or returned from) a :class:`CheckpointStore`."""

    step: int
    name: str
    nbytes: int
    meta: dict[str, Any] = field(default_factory=dict)


def _file_stem(key: str) -> str:
    if "/" not in key:
        return ROOT_FILE
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", key.split("/", 1)[0]).lstrip(".")
    return stem or "_"


class CheckpointStore:
    """Saves, lists, verifies and prunes checkpoints under one location."""

    def __init__(self, url: str, keep_last: int = 3) -> None:
        """Open a store.

        Args:
            url: local path or fsspec URL (e.g. ``memory://run1``); created on first save.
            keep_last: how many complete checkpoints to keep per tag (>= 1).

        Raises:
            ValueError: if ``keep_last`` < 1.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.url = url
        self.keep_last = keep_last
        self._fs, root = url_to_fs(url)
        self._root = root.rstrip("/") or "/"
        self._local = isinstance(self._fs, LocalFileSystem)
        self._lock = threading.RLock()
        self._inflight: set[str] = set()
        self._bytes_written = 0

    # ----------------------------------------------------------------- helpers
    def _path(self, *parts: str) -> str:
        return "/".join([self._root.rstrip("/"), *parts])

    def _write(self, path: str, data: bytes) -> None:
        with self._fs.open(path, "wb") as f:
            f.write(data)
            if self._local:
                f.flush()
                os.fsync(f.fileno())

    def _fsync_root(self) -> None:
        if self._local:
            fd = os.open(self._root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _entries(self) -> list[str]:
        self._fs.invalidate_cache(self._root)
        try:
            paths = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        return sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in paths)

    def _remove(self, name: str) -> None:
        """Delete a checkpoint folder, manifest first so it is never seen half-deleted."""
        manifest = self._path(name, MANIFEST)
        if self._fs.exists(manifest):
            self._fs.rm(manifest)
        if self._fs.exists(self._path(name)):
            self._fs.rm(self._path(name), recursive=True)

    def _read_info(self, name: str, step: int) -> CheckpointInfo | None:
        try:
            raw = self._fs.cat_file(self._path(name, MANIFEST))
        except FileNotFoundError:
            return None  # incomplete (or deleted meanwhile)
        try:
            man = json.loads(raw)
            nbytes = len(raw) + sum(int(f["bytes"]) for f in man["files"].values())
            return CheckpointInfo(step, name, nbytes, dict(man.get("meta") or {}))
        except (ValueError, KeyError, TypeError, AttributeError):
            # Listed so load()/load_latest() can report it as corrupt.
            return CheckpointInfo(step, name, len(raw), {})

    # ------------------------------------------------------------------ public
    def save(
        self,
        step: int,
        tensors: dict[str, torch.Tensor],
        meta: dict[str, Any] | None = None,
        *,
        tag: str = "ckpt",
    ) -> CheckpointInfo:
        """Write a checkpoint atomically, then prune this tag down to ``keep_last``.

        The checkpoint just written is always kept; of the others, the highest steps are kept.
        Saving a step that already exists for ``tag`` replaces it (old folder renamed aside,
        new one renamed in, old one deleted; a crash between the two renames loses only that
        step, never an older checkpoint).

        Args:
            step: iteration the checkpoint was taken at (>= 0).
            tensors: name -> tensor; ``"shard0/W"`` goes to file ``shard0.safetensors``.
                Tensors are detached, moved to CPU and made contiguous; dtype is kept.
            meta: JSON-able user metadata stored in the manifest.
            tag: checkpoint family (letters, digits, ``_``, ``-``).

        Returns:
            The :class:`CheckpointInfo` of the new checkpoint.

        Raises:
            ValueError: bad step, tag or key. TypeError: ``meta`` not JSON-able.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not _TAG_RE.match(tag):
            raise ValueError(f"bad checkpoint tag {tag!r}: use letters, digits, '_' and '-'")
        meta = json.loads(json.dumps(meta or {}))  # fail before writing; as load() returns it
        groups: dict[str, dict[str, torch.Tensor]] = {}
        seen: set[int] = set()
        for key, t in tensors.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"tensor keys must be non-empty strings, got {key!r}")
            t = t.detach().to("cpu").contiguous()
            ptr = t.untyped_storage().data_ptr()
            if t.numel() and ptr in seen:  # safetensors refuses shared storage
                t = t.clone()
            seen.add(t.untyped_storage().data_ptr())
            groups.setdefault(f"{_file_stem(key)}.safetensors", {})[key] = t

        name = f"{tag}-{step:08d}"
        tmp = f"{name}.tmp-{uuid.uuid4().hex}"
        with self._lock:
            self._inflight.add(tmp)
        try:
            self._fs.makedirs(self._path(tmp), exist_ok=True)
            files: dict[str, dict[str, Any]] = {}
            for fname, group in sorted(groups.items()):
                data = safetensors.torch.save(group)
                self._write(self._path(tmp, fname), data)
                digest = hashlib.sha256(data).hexdigest()
                files[fname] = {"sha256": digest, "bytes": len(data), "keys": sorted(group)}
            manifest = {
                "format": FORMAT,
                "step": step,
                "tag": tag,
                "files": files,
                "meta": meta,
                # Fixed-width text, so a checkpoint's byte count (which the sim engine
                # charges to its clock) does not depend on when it was written.
                "created": f"{time.time():017.6f}",
            }
            raw = json.dumps(manifest, indent=1, sort_keys=True).encode()
            self._write(self._path(tmp, MANIFEST), raw)  # LAST: marks completeness
            nbytes = len(raw) + sum(f["bytes"] for f in files.values())

            with self._lock:
                old = None
                if self._fs.exists(self._path(name)):  # same step again: move aside first
                    old = f"{name}.tmp-{uuid.uuid4().hex}"
                    self._inflight.add(old)
                    self._fs.mv(self._path(name), self._path(old), recursive=True)
                self._fs.mv(self._path(tmp), self._path(name), recursive=True)
                self._inflight.discard(tmp)
                self._fsync_root()
                if old is not None:
                    self._remove(old)
                    self._inflight.discard(old)
                self._bytes_written += nbytes
                self._prune(tag, keep=name)
            return CheckpointInfo(step, name, nbytes, meta)
        except BaseException:
            # Best effort; after a hard crash the next save of this tag cleans it.
            with contextlib.suppress(Exception):
                if self._fs.exists(self._path(tmp)):
                    self._fs.rm(self._path(tmp), recursive=True)
            raise
        finally:
            with self._lock:
                self._inflight.discard(tmp)

    def _prune(self, tag: str, keep: str) -> None:
        """Drop ``tag``'s temp/manifest-less folders and all but ``keep_last`` checkpoints."""
        tmp_re = re.compile(rf"^{re.escape(tag)}-\d+(\.tmp-[0-9a-f]+)?$")
        for entry in self._entries():
            if not tmp_re.match(entry) or entry in self._inflight or entry == keep:
                continue
            if ".tmp-" in entry or not self._fs.exists(self._path(entry, MANIFEST)):
                self._fs.rm(self._path(entry), recursive=True)  # crashed writer's leftovers
        others = [i.name for i in self.list(tag) if i.name != keep]
        for name in others[: max(0, len(others) - (self.keep_last - 1))]:
            self._remove(name)

    def list(self, tag: str = "ckpt") -> list[CheckpointInfo]:
        """List complete checkpoints (manifest present) of ``tag``.

        Args:
            tag: checkpoint family.

        Returns:
            Checkpoints in ascending step order. Temp and manifest-less folders are skipped.
        """
        pat = re.compile(rf"^{re.escape(tag)}-(\d+)$")
        out: list[CheckpointInfo] = []
        with self._lock:
            for entry in self._entries():
                m = pat.match(entry)
                info = self._read_info(entry, int(m.group(1))) if m else None
                if info is not None:
                    out.append(info)
        return sorted(out, key=lambda i: i.step)

    def load(
        self, info_or_step: CheckpointInfo | int, tag: str = "ckpt"
    ) -> tuple[dict[str, torch.Tensor], CheckpointInfo]:
        """Load and verify one checkpoint.

        Args:
            info_or_step: a :class:`CheckpointInfo` from :meth:`list`, or a step number.
            tag: checkpoint family (ignored when an info is given).

        Returns:
            ``(tensors, info)`` with the original keys, shapes and dtypes.

        Raises:
            CheckpointCorrupt: missing/incomplete checkpoint, bad manifest, missing or
                truncated file, checksum mismatch or unreadable tensors; the message names
                the path and the problem.
        """
        if isinstance(info_or_step, CheckpointInfo):
            name, step = info_or_step.name, info_or_step.step
        else:
            step = int(info_or_step)
            name = f"{tag}-{step:08d}"
        where = self._path(name)

        def bad(what: str) -> CheckpointCorrupt:
            return CheckpointCorrupt(f"checkpoint {where} is corrupt: {what}")

        with self._lock:
            try:
                raw = self._fs.cat_file(self._path(name, MANIFEST))
            except FileNotFoundError:
                if self._fs.exists(where):
                    raise bad(f"no {MANIFEST} (interrupted write)") from None
                raise CheckpointCorrupt(f"checkpoint {where} does not exist") from None
            try:
                man = json.loads(raw)
                files = man["files"]
                if man.get("format") != FORMAT or int(man["step"]) != step:
                    raise ValueError("wrong format or step")
                entries = [
                    (f, int(v["bytes"]), str(v["sha256"]), list(v["keys"]))
                    for f, v in files.items()
                ]
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise bad(f"unreadable {MANIFEST} ({e})") from None
            tensors: dict[str, torch.Tensor] = {}
            for fname, size, sha, keys in entries:
                if not _FILE_RE.match(fname):
                    raise bad(f"{MANIFEST} names an invalid file {fname!r}")
                try:
                    data = self._fs.cat_file(self._path(name, fname))
                except FileNotFoundError:
                    raise bad(f"{fname} is missing") from None
                if len(data) != size:
                    raise bad(f"{fname} has {len(data)} bytes, manifest says {size} (truncated?)")
                if hashlib.sha256(data).hexdigest() != sha:
                    raise bad(f"{fname} fails its sha256 check")
                try:
                    part = safetensors.torch.load(data)
                except Exception as e:  # any parse failure means corrupt
                    raise bad(f"{fname} is not valid safetensors ({e})") from None
                if sorted(part) != sorted(keys):
                    raise bad(f"{fname} holds keys {sorted(part)}, manifest says {sorted(keys)}")
                tensors.update(part)
        nbytes = len(raw) + sum(e[1] for e in entries)
        return tensors, CheckpointInfo(step, name, nbytes, dict(man.get("meta") or {}))

    def load_latest(
        self, tag: str = "ckpt", on_corrupt: Callable[[str], None] | None = None
    ) -> tuple[dict[str, torch.Tensor], CheckpointInfo] | None:
        """Load the newest checkpoint of ``tag`` that verifies.

        Args:
            tag: checkpoint family.
            on_corrupt: called with the error message (naming the checkpoint) for every
                newer checkpoint that failed verification and was skipped.

        Returns:
            ``(tensors, info)``, or ``None`` if no valid checkpoint exists.
        """
        with self._lock:  # no pruning between listing and loading
            for info in reversed(self.list(tag)):
                try:
                    return self.load(info)
                except CheckpointCorrupt as e:
                    if on_corrupt is not None:
                        on_corrupt(str(e))
        return None

    def delete(self, info: CheckpointInfo) -> None:
        """Delete one checkpoint (manifest first, so it is never listed half-deleted)."""
        with self._lock:
            self._remove(info.name)

    def total_bytes_written(self) -> int:
        """Return bytes written by this store object (tensor files + manifests) so far."""
        with self._lock:
            return self._bytes_written
