"""The checkpoint manifest: its schema, and the only code that parses or writes it.

A manifest is untrusted input: a disk, a bucket or a person may have changed any byte.
:func:`parse_manifest` therefore validates every field before anything uses it
(type, range, finiteness, required and unknown keys, names against their regexes,
sizes bounded, keys consistent with the file they are said to be in) and turns every
way it can fail (bad UTF-8, ``Infinity``, ``1e400``, ``2**70``, duplicate keys,
nesting deep enough to exhaust the parser's recursion) into one :class:`ManifestError`.
The raw bytes are bounded by the caller (:data:`MAX_MANIFEST_BYTES`) before parsing.

The manifest also carries its own ``checksum`` (sha256 of its canonical JSON without
that field): tensor files are covered by their own checksum (CRC-32 from format ``/3``,
sha256 in ``/2``, which stays readable: :mod:`.checksums`), and this covers the rest, so
a changed field that still type-checks (a step in ``meta``, a tag, a size) is caught too.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from trainthrough.ft.checkpoint.checksums import ALGORITHMS, CURRENT

FORMAT = "trainthrough-checkpoint/3"  # /2: run id and manifest checksum; /3: files' CRC-32
#: Every format a reader accepts -> the checksum its file entries carry.
READABLE = {FORMAT: CURRENT, "trainthrough-checkpoint/2": "sha256"}
MANIFEST = "manifest.json"
ROOT_FILE = "root"  # file stem for keys without a "/" prefix

# Bounds: generous for any real model, small enough that a corrupt number cannot make
# a reader allocate or loop without end.
MAX_MANIFEST_BYTES = 16 << 20
MAX_FILE_BYTES = 1 << 40
MAX_FILES = 4096
MAX_KEY_CHARS = 1024
MAX_STEP = (1 << 53) - 1  # exact in a JSON double, so any reader agrees on it
MAX_META_DEPTH = 32
MIN_FILE_BYTES = 8  # a safetensors file starts with its 8-byte header length

TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}\.safetensors$")
_CREATED_RE = re.compile(r"^[0-9]{10,11}\.[0-9]{6}$")
_REQUIRED = {"format", "step", "tag", "files", "meta", "created", "checksum"}
_OPTIONAL = {"run"}  # absent in stores that are not scoped to a run


class ManifestError(ValueError):
    """The manifest is not one this code wrote (the message says which field)."""


@dataclass(frozen=True)
class FileEntry:
    """One tensor file as the manifest describes it."""

    name: str
    digest: str  # hex, of the algorithm below
    nbytes: int
    keys: tuple[str, ...]
    algorithm: str = CURRENT


@dataclass(frozen=True)
class Manifest:
    """A validated manifest; ``size`` is its own length in bytes."""

    step: int
    tag: str
    run: str | None
    files: tuple[FileEntry, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    size: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the whole checkpoint: the manifest plus every tensor file."""
        return self.size + sum(f.nbytes for f in self.files)

    @property
    def keys(self) -> set[str]:
        return {k for f in self.files for k in f.keys}


def file_stem(key: str) -> str:
    """The file a tensor key goes to: the part before the first ``/``, sanitized."""
    if "/" not in key:
        return ROOT_FILE
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", key.split("/", 1)[0]).lstrip(".")
    return stem or "_"


def _is_int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def check_meta(meta: Any) -> dict[str, Any]:
    """Normalize user metadata as a manifest stores it; refuse what a reader would refuse.

    Raises:
        TypeError: not JSON-able. ValueError: not an object, non-finite numbers, or too deep.
    """
    out = json.loads(json.dumps(meta if meta is not None else {}, allow_nan=False))
    if not isinstance(out, dict):
        raise ValueError(f"checkpoint metadata must be a JSON object, got {type(meta).__name__}")
    if _depth(out) > MAX_META_DEPTH:
        raise ValueError(f"checkpoint metadata nests deeper than {MAX_META_DEPTH} levels")
    return out


def _no_constants(name: str) -> Any:
    raise ManifestError(f"non-finite number {name}")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ManifestError(f"number {text[:20]} overflows")
    return x


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ManifestError("duplicate key in a JSON object")
    return out


def _parse_json(raw: bytes) -> Any:
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{len(raw)} bytes, more than the {MAX_MANIFEST_BYTES} allowed")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constants,
                          parse_float=_finite, object_pairs_hook=_unique)
    except RecursionError:
        raise ManifestError("JSON nested too deeply") from None
    except ManifestError:
        raise
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int too long
        raise ManifestError(str(e)[:200]) from None


def _file_entry(name: Any, v: Any, algorithm: str) -> FileEntry:
    if not isinstance(name, str) or not FILE_RE.fullmatch(name):
        raise ManifestError(f"invalid file name {str(name)[:80]!r}")
    fields = {algorithm, "bytes", "keys"}
    if not isinstance(v, dict) or set(v) != fields:
        raise ManifestError(f"entry of {name} must hold exactly {sorted(fields)}")
    digest, size, keys = v[algorithm], v["bytes"], v["keys"]
    digits = ALGORITHMS[algorithm]
    if not isinstance(digest, str) or not re.fullmatch(f"[0-9a-f]{{{digits}}}", digest):
        raise ManifestError(f"{name}: {algorithm} is not {digits} lowercase hex digits")
    if not _is_int(size, MIN_FILE_BYTES, MAX_FILE_BYTES):
        raise ManifestError(f"{name}: bytes must be an integer in "
                            f"[{MIN_FILE_BYTES}, {MAX_FILE_BYTES}], got {str(size)[:40]}")
    if not isinstance(keys, list) or not keys:
        raise ManifestError(f"{name}: keys must be a non-empty list")
    for k in keys:
        if not isinstance(k, str) or not 0 < len(k) <= MAX_KEY_CHARS:
            raise ManifestError(f"{name}: a key is not a non-empty string")
        if f"{file_stem(k)}.safetensors" != name:  # save() groups keys by this rule
            raise ManifestError(f"{name}: key {k[:80]!r} does not belong in this file")
    if len(set(keys)) != len(keys):
        raise ManifestError(f"{name}: duplicate keys")
    return FileEntry(name, digest, size, tuple(keys), algorithm)


def parse_manifest(raw: bytes, *, step: int, tag: str) -> Manifest:
    """Parse and validate a manifest read from checkpoint ``<tag>-<step>``.

    The ``run`` field is returned, not checked: whether a checkpoint belongs to the
    reader is the store's decision (a foreign one is skipped, never pruned).

    Raises:
        ManifestError: anything at all wrong; the message names the field.
    """
    man = _parse_json(raw)
    if not isinstance(man, dict):
        raise ManifestError("not a JSON object")
    missing, unknown = _REQUIRED - set(man), set(man) - _REQUIRED - _OPTIONAL
    if missing or unknown:
        raise ManifestError(f"missing fields {sorted(missing)}, unknown fields {sorted(unknown)}")
    algorithm = READABLE.get(man["format"]) if isinstance(man["format"], str) else None
    if algorithm is None:
        raise ManifestError(f"format is {str(man['format'])[:60]!r}, expected one of "
                            f"{sorted(READABLE)}")
    if not _is_int(man["step"], 0, MAX_STEP) or man["step"] != step:
        raise ManifestError(f"step is {str(man['step'])[:40]}, the folder says {step}")
    if man["tag"] != tag:
        raise ManifestError(f"tag is {str(man['tag'])[:80]!r}, the folder says {tag!r}")
    run = man.get("run")
    if run is not None and (not isinstance(run, str) or not RUN_RE.fullmatch(run)):
        raise ManifestError(f"invalid run id {str(run)[:80]!r}")
    if not isinstance(man["created"], str) or not _CREATED_RE.fullmatch(man["created"]):
        raise ManifestError("created is not a fixed-width timestamp")
    meta = man["meta"]
    if not isinstance(meta, dict) or _depth(meta) > MAX_META_DEPTH:
        raise ManifestError(f"meta must be a JSON object at most {MAX_META_DEPTH} levels deep")
    files = man["files"]
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES:
        raise ManifestError(f"files must map 1 to {MAX_FILES} file names to entries")
    entries = tuple(_file_entry(n, v, algorithm) for n, v in sorted(files.items()))
    if man["checksum"] != checksum({k: v for k, v in man.items() if k != "checksum"}):
        raise ManifestError("fails its checksum (a field was changed)")
    return Manifest(step, tag, run, entries, meta, len(raw))


def checksum(doc: dict[str, Any]) -> str:
    """sha256 of ``doc``'s canonical JSON (sorted keys, no whitespace)."""
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(body.encode()).hexdigest()


def encode_manifest(step: int, tag: str, run: str | None, files: list[FileEntry],
                    meta: dict[str, Any], created: float) -> bytes:
    """The bytes :func:`parse_manifest` accepts for these values (``meta`` pre-checked;
    every file's checksum of the :data:`~.checksums.CURRENT` algorithm)."""
    if any(f.algorithm != CURRENT for f in files):
        raise ValueError(f"files of a new manifest are checked by {CURRENT}")
    doc: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "tag": tag,
        "files": {f.name: {f.algorithm: f.digest, "bytes": f.nbytes, "keys": list(f.keys)}
                  for f in files},
        "meta": meta,
        # Fixed-width text, so a checkpoint's byte count (which the sim engine
        # charges to its clock) does not depend on when it was written.
        "created": f"{created:017.6f}",
    }
    if run is not None:
        doc["run"] = run
    doc["checksum"] = checksum(doc)
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False).encode()
