"""Crash-consistent checkpoint store on a local path or any fsspec URL.

Layout: one checkpoint is one folder ``<url>/<tag>-<step:08d>/`` holding one or more
safetensors files (tensors grouped by the key prefix before the first ``/``) and a
``manifest.json`` listing every file with its size, CRC-32 and keys (schema and
limits: :mod:`.manifest`). A store opened on a run's location (``<dir>/run-<id>``,
:mod:`.location`) stamps the run id into each manifest and never loads or prunes a
checkpoint stamped with another id.

Crash consistency rests on three rules:

* Everything is written into a private temp folder ``<tag>-<step>.tmp-<hex>/`` and the
  manifest is written LAST, so its existence means the checkpoint is complete. Tensor
  files and manifest are fsynced (together: :mod:`.durable`), then the finished folder
  is renamed to its final name and its parent fsynced. A writer that dies at any point
  leaves either nothing under the final name or a complete checkpoint; :meth:`list`
  ignores temp folders and folders without a manifest, and the next successful save of
  the same tag removes the leftovers.
* Old checkpoints are pruned only after the new one is complete and renamed, and a pruned
  checkpoint loses its manifest first, so a half-deleted folder is never listed.
* Everything read is untrusted: the manifest is bounded and schema-checked, every tensor
  file verified (size, checksum, parseable, expected keys, no unlisted files), and any
  filesystem error on one checkpoint makes that checkpoint corrupt, nothing more:
  :meth:`CheckpointStore.load_latest` reports it by name and falls back to the previous
  one. Nothing is ever unpickled: tensors go through ``safetensors`` bytes APIs.

One writer per (location, tag) is assumed; several threads of one process may share a store.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import safetensors.torch
import torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from trainthrough.errors import CheckpointCorrupt, CheckpointWriteFailed
from trainthrough.ft.checkpoint import durable, stream
from trainthrough.ft.checkpoint.checksums import Crc32
from trainthrough.ft.checkpoint.location import run_of
from trainthrough.ft.checkpoint.manifest import (
    MANIFEST,
    MAX_STEP,
    TAG_RE,
    FileEntry,
    Manifest,
    check_meta,
    encode_manifest,
    file_stem,
)
from trainthrough.ft.checkpoint.verify import (
    Like,
    Tensors,
    entries,
    read_manifest,
    read_tensors,
)

#: A caller's check of the metadata it will use; raising anything rejects the checkpoint.
MetaCheck = Callable[[dict[str, Any]], object]


def require_ints(*keys: str) -> MetaCheck:
    """A :data:`MetaCheck`: each of ``keys`` is in the metadata, a non-negative integer."""

    def check(meta: dict[str, Any]) -> None:
        for k in keys:
            v = meta.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_STEP:
                raise ValueError(f"{k} is {str(v)[:40]}, not an integer in [0, {MAX_STEP}]")

    return check


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint as listed by (or returned from) a :class:`CheckpointStore`."""

    step: int
    name: str
    nbytes: int
    meta: dict[str, Any] = field(default_factory=dict)
    run: str | None = field(default=None, compare=False)


class CheckpointStore:
    """Saves, lists, verifies and prunes checkpoints under one location."""

    def __init__(self, url: str, keep_last: int = 3) -> None:
        """Open a store.

        Args:
            url: local path or fsspec URL (e.g. ``memory://run1``); created on first save.
                A run's location (``run_location(dir, id)``) scopes the store to that run.
            keep_last: how many complete checkpoints to keep per tag (>= 1).

        Raises:
            ValueError: if ``keep_last`` < 1.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.url = url
        self.keep_last = keep_last
        self.run_id = run_of(url)
        self._fs, root = url_to_fs(url)
        self._root = root.rstrip("/") or "/"
        self._local = isinstance(self._fs, LocalFileSystem)
        self._lock = threading.RLock()
        self._inflight: set[str] = set()
        self._manifests: dict[str, tuple[tuple[object, ...], Manifest]] = {}
        self._bytes_written = 0
        #: (seconds to write the last save durably, seconds to prune after it)
        self.last_timing = (0.0, 0.0)

    # ----------------------------------------------------------------- helpers
    def _path(self, *parts: str) -> str:
        return "/".join([self._root.rstrip("/"), *parts])

    def _open_write(self, path: str) -> IO[bytes]:
        """A new file for writing; a plain file locally (fsspec's wrapper adds a fixed
        cost per file, a noticeable share of a small checkpoint's write)."""
        return open(path, "wb") if self._local else self._fs.open(path, "wb")

    def _write(self, path: str, data: bytes) -> None:
        """Write one file, not yet durable: :meth:`_sync` makes a batch durable."""
        with self._open_write(path) as f:
            f.write(data)

    def _sync(self, paths: list[str]) -> durable.Syncing | None:
        """Start making written files durable, all together (:mod:`.durable`); None
        for a remote store (its writes are durable once closed)."""
        return durable.Syncing(paths) if self._local else None

    def _fsync_root(self) -> None:
        if self._local:
            durable.fsync_path(self._root)

    def _remove(self, name: str) -> None:
        """Delete a checkpoint folder, manifest first so it is never seen half-deleted."""
        manifest = self._path(name, MANIFEST)
        if self._fs.exists(manifest):
            self._fs.rm(manifest)
        if self._fs.exists(self._path(name)):
            self._fs.rm(self._path(name), recursive=True)

    def _scan(self, tag: str, remembered: bool = False) -> list[tuple[CheckpointInfo, bool]]:
        """Every complete-looking checkpoint of ``tag``, ascending; ``True`` if it is ours.

        Corrupt ones are listed (so loading reports them) as ours; ones stamped with
        another run id are listed as not ours: reported, never loaded nor pruned.
        """
        if not TAG_RE.fullmatch(tag):
            raise ValueError(f"bad checkpoint tag {tag!r}: use letters, digits, '_' and '-'")
        pat = re.compile(rf"^{re.escape(tag)}-([0-9]{{1,20}})$")
        out: list[tuple[CheckpointInfo, bool]] = []
        for entry in entries(self._fs, self._root):
            m = pat.fullmatch(entry)
            if not m:
                continue
            step = int(m.group(1))
            try:
                man = (self._manifest(entry, step, tag) if remembered
                       else read_manifest(self._fs, self._path(entry), step, tag))
            except CheckpointCorrupt:
                out.append((CheckpointInfo(step, entry, 0, {}), True))
                continue
            if man is not None:
                info = CheckpointInfo(step, entry, man.nbytes, dict(man.meta), man.run)
                out.append((info, man.run == self.run_id))
        return sorted(out, key=lambda x: x[0].step)

    def _manifest(self, entry: str, step: int, tag: str) -> Manifest | None:
        """:func:`read_manifest`, remembered while the file is unchanged (:meth:`_signature`):
        every save lists its tag to prune it, and parsing and checking each kept manifest
        again would take the writing thread's time at every save, under the GIL the
        shard's pushes need (in memory too: a checkpointed sim run, 5 runs interleaved,
        0.92-1.03 -> 0.87-0.89 CPU s with it). Only pruning
        uses it; listing and loading always read afresh (a manifest rewritten in place
        at the same size within one tick of the file clock would look unchanged)."""
        where = self._path(entry)
        sig = self._signature(f"{where}/{MANIFEST}")
        hit = self._manifests.get(entry)
        if sig is not None and hit is not None and hit[0] == sig:
            return hit[1]
        man = read_manifest(self._fs, where, step, tag)
        if sig is not None and man is not None:
            if len(self._manifests) > 4 * self.keep_last + 16:
                self._manifests.clear()  # bounded: only what is listed again is reread
            self._manifests[entry] = (sig, man)
        return man

    def _signature(self, path: str) -> tuple[object, ...] | None:
        """What changes when ``path`` is written again: inode, size and modification
        time locally; elsewhere the size and whatever clock or tag the storage reports
        (fsspec's ``info``: ``created`` in memory, ``mtime``, ``LastModified``,
        ``ETag``). None (never remembered) where the storage reports none, or the file
        cannot be read."""
        try:
            if self._local:
                st = os.stat(path)
                return (st.st_ino, st.st_size, st.st_mtime_ns)
            info = self._fs.info(path)
        except (OSError, ValueError):
            return None
        stamp = next((info[k] for k in ("created", "mtime", "LastModified", "ETag")
                      if info.get(k) is not None), None)
        return None if stamp is None else (info.get("size"), stamp)

    # ------------------------------------------------------------------ public
    def save(
        self,
        step: int,
        tensors: Mapping[str, torch.Tensor],
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
            step: iteration the checkpoint was taken at (0 <= step < 2**53).
            tensors: name -> tensor (at least one); ``"shard0/W"`` goes to file
                ``shard0.safetensors``. Tensors are detached, moved to CPU and made
                contiguous; dtype is kept.
            meta: JSON-able user metadata stored in the manifest (finite numbers,
                at most 32 levels deep).
            tag: checkpoint family (letters, digits, ``_``, ``-``).

        Returns:
            The :class:`CheckpointInfo` of the new checkpoint.

        Raises:
            ValueError: bad step, tag, key or meta. TypeError: ``meta`` not JSON-able.
        """
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
            raise ValueError(f"step must be an integer in [0, {MAX_STEP}], got {step!r}")
        if not TAG_RE.fullmatch(tag):
            raise ValueError(f"bad checkpoint tag {tag!r}: use letters, digits, '_' and '-'")
        if not tensors:
            raise ValueError("a checkpoint needs at least one tensor")
        meta = check_meta(meta)  # fail before writing; as load() returns it
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
            groups.setdefault(f"{file_stem(key)}.safetensors", {})[key] = t

        name = f"{tag}-{step:08d}"
        tmp = f"{name}.tmp-{uuid.uuid4().hex}"
        with self._lock:
            self._inflight.add(tmp)
        try:
            t0 = time.perf_counter()
            self._fs.makedirs(self._path(tmp), exist_ok=True)
            pending: list[tuple[str, Callable[[], str], int, tuple[str, ...]]] = []
            for fname, group in sorted(groups.items()):
                path = self._path(tmp, fname)
                if stream.streamable(group):  # the same bytes, without building them first
                    with self._open_write(path) as f:
                        digest, size = stream.write_deferred(f, group)
                else:
                    data = safetensors.torch.save(group)
                    self._write(path, data)
                    digest, size = _known(Crc32(data).hexdigest()), len(data)
                pending.append((fname, digest, size, tuple(sorted(group))))
            paths = [self._path(tmp, fname) for fname, *_ in pending]
            # Large files are still being checksummed: make them durable meanwhile
            # (waiting for one before the other cost both). Small ones are checksummed
            # already, and one batch of fsyncs for tensors and manifest together is one
            # journal commit instead of two.
            early = (self._local and
                     any(size >= stream.PARALLEL_BYTES for _, _, size, _ in pending))
            syncing = self._sync(paths) if early else None
            manifest = self._path(tmp, MANIFEST)
            # Tensor files and manifest are durable, still under the temp name, before
            # the folder is renamed (and the rename made durable), so the final name
            # never points at data a crash could have torn.
            try:
                files = [FileEntry(fname, digest(), size, keys)
                         for fname, digest, size, keys in pending]
                raw = encode_manifest(step, tag, self.run_id, files, meta, time.time())
                self._write(manifest, raw)  # LAST: marks completeness
                last = self._sync([manifest] if early else [*paths, manifest])
                if last is not None:
                    last.wait()
            finally:
                if syncing is not None:
                    syncing.wait()  # also after a failure: no fsync left running
            nbytes = len(raw) + sum(f.nbytes for f in files)

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
                written = time.perf_counter()
                self._prune(tag, keep=name)
                self.last_timing = (written - t0, time.perf_counter() - written)
            return CheckpointInfo(step, name, nbytes, meta, self.run_id)
        except BaseException as e:
            # Best effort; after a hard crash the next save of this tag cleans it.
            with contextlib.suppress(Exception):
                if self._fs.exists(self._path(tmp)):
                    self._fs.rm(self._path(tmp), recursive=True)
            if isinstance(e, OSError) and not isinstance(e, CheckpointWriteFailed):
                # The storage's, not a bug: named, for one line to the user.
                raise CheckpointWriteFailed(
                    f"checkpoint {name} could not be written to {self.url}: "
                    f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")) from e
            raise
        finally:
            with self._lock:
                self._inflight.discard(tmp)

    def _prune(self, tag: str, keep: str) -> None:
        """Drop ``tag``'s leftovers and all but ``keep_last`` of this run's checkpoints.

        Best effort: a checkpoint that cannot be removed now is retried at the next save;
        the save that just completed is not undone by it. Checkpoints stamped with
        another run id are never touched.
        """
        tmp_re = re.compile(rf"^{re.escape(tag)}-[0-9]+(\.tmp-[0-9a-f]+)?$")
        for entry in entries(self._fs, self._root):
            if not tmp_re.fullmatch(entry) or entry in self._inflight or entry == keep:
                continue
            if ".tmp-" in entry or not self._fs.exists(self._path(entry, MANIFEST)):
                with contextlib.suppress(OSError):  # a crashed writer's leftovers
                    self._fs.rm(self._path(entry), recursive=True)
        ours = [i.name for i, owned in self._scan(tag, remembered=True)
                if owned and i.name != keep]
        for name in ours[: max(0, len(ours) - (self.keep_last - 1))]:
            with contextlib.suppress(OSError):
                self._remove(name)

    def list(self, tag: str = "ckpt") -> list[CheckpointInfo]:
        """List this run's complete checkpoints (manifest present) of ``tag``.

        Args:
            tag: checkpoint family.

        Returns:
            Checkpoints in ascending step order, corrupt ones included (loading them
            raises). Temp and manifest-less folders and other runs' checkpoints are skipped.
        """
        with self._lock:
            return [info for info, owned in self._scan(tag) if owned]

    def load(
        self,
        info_or_step: CheckpointInfo | int,
        tag: str = "ckpt",
        *,
        like: Like | None = None,
        check: MetaCheck | None = None,
    ) -> tuple[Tensors, CheckpointInfo]:
        """Load and verify one checkpoint.

        Args:
            info_or_step: a :class:`CheckpointInfo` from :meth:`list`, or a step number.
            tag: checkpoint family (taken from the name when an info is given).
            like: what the caller will read: exactly these keys (checked against the
                manifest before any tensor file is read) and, where a tensor is given,
                its dtype and shape.
            check: validates the metadata the caller will use; raising rejects it.

        Returns:
            ``(tensors, info)`` with the original keys, shapes and dtypes.

        Raises:
            CheckpointCorrupt: missing/incomplete checkpoint, invalid manifest, another
                run's checkpoint, missing/extra/truncated file, checksum mismatch,
                unreadable tensors, unexpected keys, or any filesystem error; the
                message names the checkpoint and the problem.
        """
        if isinstance(info_or_step, CheckpointInfo):
            name, step = info_or_step.name, info_or_step.step
            tag = name.rsplit("-", 1)[0]
        else:
            step = int(info_or_step)
            name = f"{tag}-{step:08d}"
        where = self._path(name)
        with self._lock:
            man = read_manifest(self._fs, where, step, tag)
            if man is None:
                if self._fs.exists(where):
                    raise CheckpointCorrupt(f"checkpoint {where} is corrupt: "
                                            f"no {MANIFEST} (interrupted write)")
                raise CheckpointCorrupt(f"checkpoint {where} does not exist")
            if man.run != self.run_id:
                raise CheckpointCorrupt(f"checkpoint {where} belongs to run {man.run}, "
                                        f"not to this run ({self.run_id}): skipped")
            try:
                tensors = read_tensors(self._fs, where, man, like)
            except OSError as e:
                raise CheckpointCorrupt(f"checkpoint {where} is corrupt: "
                                        f"{type(e).__name__}: {e}") from None
            except ValueError as e:
                raise CheckpointCorrupt(f"checkpoint {where} is corrupt: {e}") from None
        if check is not None:
            try:
                check(dict(man.meta))
            except Exception as e:  # the caller's own validation: any failure rejects
                raise CheckpointCorrupt(f"checkpoint {where} is corrupt: meta unusable "
                                        f"({type(e).__name__}: {e})") from None
        return tensors, CheckpointInfo(step, name, man.nbytes, dict(man.meta), man.run)

    def load_latest(
        self,
        tag: str = "ckpt",
        on_corrupt: Callable[[str], None] | None = None,
        *,
        like: Like | None = None,
        check: MetaCheck | None = None,
    ) -> tuple[Tensors, CheckpointInfo] | None:
        """Load the newest checkpoint of ``tag`` that verifies.

        Args:
            tag: checkpoint family.
            on_corrupt: called with the error message (naming the checkpoint) for every
                newer checkpoint that failed verification, or belongs to another run,
                and was skipped.
            like, check: as for :meth:`load`.

        Returns:
            ``(tensors, info)``, or ``None`` if no valid checkpoint exists.
        """
        with self._lock:  # no pruning between listing and loading
            for info, _ in reversed(self._scan(tag)):
                try:
                    return self.load(info, like=like, check=check)
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


def _known(digest: str) -> Callable[[], str]:
    return lambda: digest
