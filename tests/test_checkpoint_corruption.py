"""Every way a checkpoint can be damaged is detected, named, and the previous one used.

Part 1 corrupts the newest of three checkpoints in a store, one way per case: every
manifest field (deleted, every wrong type, extreme numbers, sealed with a recomputed
checksum so only the schema can catch it, or changed to another plausible value),
every file (flipped bytes, truncated, grown, deleted, a folder in its place), files
swapped between checkpoints, a file where the folder should be, extra files, an empty
files map, nested and oversized JSON, another run's checkpoint. Each case asserts the
corrupt checkpoint is named (``load`` raises, ``load_latest`` reports it) and that
``load_latest`` falls back to the newest valid one, and that the store keeps working.

Part 2 corrupts the newest checkpoint inside a recovering run, from the ``failure``
event (so before the restore), on every engine that checkpoints: sim parameter
server, sim data parallel, ray and dist (gloo). The run must resume from the previous
checkpoint, converge, and name the skipped checkpoint in ``events.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from fsspec.core import url_to_fs

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.result import RunResult
from trainthrough.errors import CheckpointCorrupt
from trainthrough.ft.checkpoint import CheckpointStore, require_ints, run_location
from trainthrough.ft.checkpoint.manifest import MAX_MANIFEST_BYTES
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.lab.runner import run

RUN = "test-run"
NEW, PREV, OLDEST = 30, 20, 10
FILES = ("a.safetensors", "b.safetensors", "root.safetensors")
CHECK = require_ints("iteration", "epoch", "offset")


def _tensors(step: int) -> dict[str, torch.Tensor]:
    return {"a/x": torch.arange(6, dtype=torch.float32).view(2, 3) + step,
            "a/y": torch.arange(4) * step, "b/z": torch.full((3,), step / 7, dtype=torch.float64),
            "root": torch.tensor(float(step))}


LIKE = _tensors(0)


@dataclass
class Ckpts:
    """A store holding checkpoints 10, 20, 30 and raw access to their bytes."""

    store: CheckpointStore
    fs: Any
    root: str

    def path(self, step: int, fname: str = "") -> str:
        return f"{self.root}/ckpt-{step:08d}" + (f"/{fname}" if fname else "")

    def read(self, step: int, fname: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(step, fname)))

    def write(self, step: int, fname: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(step, fname), data)

    def manifest(self, step: int = NEW) -> dict[str, Any]:
        return json.loads(self.read(step, "manifest.json"))

    def put_manifest(self, man: dict[str, Any], step: int = NEW, seal: bool = False) -> None:
        """Write ``man`` back; ``seal`` recomputes its checksum, as a buggy or hostile
        writer would, so that only the schema checks stand in the way."""
        if seal:
            body = {k: v for k, v in man.items() if k != "checksum"}
            text = json.dumps(body, sort_keys=True, separators=(",", ":"))
            man = {**man, "checksum": hashlib.sha256(text.encode()).hexdigest()}
        self.write(step, "manifest.json", json.dumps(man, indent=1, sort_keys=True).encode())

    def replace_file(self, step: int, fname: str, tensors: dict[str, torch.Tensor]) -> None:
        """Rewrite a tensor file consistently (size, checksum and keys in the manifest)."""
        data = safetensors.torch.save(tensors)
        self.write(step, fname, data)
        man = self.manifest(step)
        man["files"][fname] = {"crc32": f"{zlib.crc32(data):08x}", "bytes": len(data),
                               "keys": sorted(tensors)}
        self.put_manifest(man, step, seal=True)


@pytest.fixture(params=["local", "memory"])
def ckpts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ckpts]:
    base = str(tmp_path) if request.param == "local" else f"memory://corrupt-{uuid.uuid4().hex}"
    url = run_location(base, RUN)
    store = CheckpointStore(url, keep_last=3)
    for step in (OLDEST, PREV, NEW):
        store.save(step, _tensors(step), {"iteration": step, "epoch": 0, "offset": step})
    fs, root = url_to_fs(url)
    yield Ckpts(store, fs, root.rstrip("/"))
    if request.param == "memory" and fs.exists(root):
        fs.rm(root, recursive=True)


# -- the catalogue: name -> (corrupt, checkpoints it damages, the one to fall back to) ---
Corrupt = Callable[[Ckpts], None]
CASES: dict[str, tuple[Corrupt, tuple[int, ...], int]] = {}


def case(name: str, damaged: tuple[int, ...] = (NEW,), fallback: int = PREV) -> Callable[
        [Corrupt], Corrupt]:
    def add(fn: Corrupt) -> Corrupt:
        CASES[name] = (fn, damaged, fallback)
        return fn
    return add


INF = float("inf")
BAD_VALUES: dict[str, Any] = {
    "null": None, "str": "x", "empty-str": "", "float": 1.5, "list": [], "dict": {},
    "bool": True, "inf": INF, "-inf": -INF, "nan": float("nan"), "-1": -1, "2**70": 2**70,
    "1e400": "__1e400__", "0": 0,
}
TOP_FIELDS = ("format", "step", "tag", "run", "files", "meta", "created", "checksum")
FILE_FIELDS = ("crc32", "bytes", "keys")
PLAUSIBLE: dict[str, Any] = {  # valid-looking different values: only the checksum sees them
    "format": "trainthrough-checkpoint/1", "step": PREV, "tag": "prio", "run": "other-run",
    "meta": {"iteration": 29, "epoch": 0, "offset": 29}, "created": "1000000000.000000",
    "checksum": "0" * 64,
}


def _set_field(path: tuple[str, ...], value: Any, seal: bool, delete: bool = False) -> Corrupt:
    def corrupt(c: Ckpts) -> None:
        man = c.manifest()
        node = man
        for p in path[:-1]:
            node = node[p]
        if delete:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        if value == "__1e400__":  # JSON text no Python float can produce
            body = json.dumps(man, indent=1, sort_keys=True).replace('"__1e400__"', "1e400")
            c.write(NEW, "manifest.json", body.encode())
            return
        c.put_manifest(man, seal=seal)
    return corrupt


for _f in TOP_FIELDS:
    case(f"manifest.{_f}:deleted")(_set_field((_f,), None, seal=_f != "checksum", delete=True))
    for _v, _val in BAD_VALUES.items():
        for _seal in (False, True) if _f != "checksum" else (False,):
            case(f"manifest.{_f}={_v}" + (":sealed" if _seal else ""))(
                _set_field((_f,), _val, _seal))
    if _f in PLAUSIBLE:
        case(f"manifest.{_f}:plausible")(_set_field((_f,), PLAUSIBLE[_f], seal=False))
for _fname in FILES:
    for _f in FILE_FIELDS:
        _p = ("files", _fname, _f)
        case(f"{_fname}.{_f}:deleted")(_set_field(_p, None, seal=True, delete=True))
        for _v, _val in BAD_VALUES.items():
            for _seal in (False, True):
                case(f"{_fname}.{_f}={_v}" + (":sealed" if _seal else ""))(
                    _set_field(_p, _val, _seal))
    case(f"{_fname}.crc32:plausible")(_set_field(("files", _fname, "crc32"), "ab" * 4, True))
    case(f"{_fname}.bytes:plausible")(_set_field(("files", _fname, "bytes"), 9, True))


# The older format (sha256 per file) is still read: a manifest must not mix the two.
@case("manifest.format:older-with-crc32-entries")
def _older_format(c: Ckpts) -> None:
    c.put_manifest({**c.manifest(), "format": "trainthrough-checkpoint/2"}, seal=True)


@case("a.safetensors:sha256-entry-in-current-format")
def _sha_entry(c: Ckpts) -> None:
    man = c.manifest()
    entry = man["files"]["a.safetensors"]
    del entry["crc32"]
    entry["sha256"] = hashlib.sha256(c.read(NEW, "a.safetensors")).hexdigest()
    c.put_manifest(man, seal=True)


def _manifest_text(fn: Callable[[bytes], bytes]) -> Corrupt:
    def corrupt(c: Ckpts) -> None:
        c.write(NEW, "manifest.json", fn(c.read(NEW, "manifest.json")))
    return corrupt


def _flip(at: float) -> Callable[[bytes], bytes]:
    def fn(data: bytes) -> bytes:
        b = bytearray(data)
        b[min(len(b) - 1, int(len(b) * at))] ^= 0xFF
        return bytes(b)
    return fn


for _at in (0.0, 0.5, 1.0):
    case(f"manifest.json:flip@{_at}")(_manifest_text(_flip(_at)))
case("manifest.json:truncated-half")(_manifest_text(lambda d: d[: len(d) // 2]))
case("manifest.json:empty")(_manifest_text(lambda d: b""))
case("manifest.json:not-json")(_manifest_text(lambda d: b"{not json"))
case("manifest.json:array")(_manifest_text(lambda d: b"[1, 2]"))
case("manifest.json:nested")(_manifest_text(lambda d: b"[" * 100_000 + b"]" * 100_000))
case("manifest.json:nested-meta")(_manifest_text(
    lambda d: d.replace(b'"meta": {', b'"meta": {"deep": ' + b"[" * 50_000 + b"]" * 50_000 + b",")))
case("manifest.json:nested-meta-40:sealed")(_set_field(("meta",), json.loads(
    '{"a":' * 40 + "1" + "}" * 40), seal=True))
case("manifest.json:duplicate-key")(_manifest_text(lambda d: d.replace(b'"step": 30', b'"step": 30, "step": 20')))
case("manifest.json:huge")(_manifest_text(lambda d: d + b" " * (MAX_MANIFEST_BYTES + 1)))
case("manifest.json:huge-int")(_manifest_text(lambda d: d.replace(b'"step": 30', b'"step": 3' + b"0" * 5000)))
case("manifest.json:unknown-field")(_set_field(("extra",), 1, seal=False))
case("manifest.json:unknown-field:sealed")(_set_field(("extra",), 1, seal=True))
case("manifest.json:invalid-utf8")(_manifest_text(lambda d: d.replace(b'"ckpt"', b'"\xff\xfe"')))


@case("manifest.json:folder")
def _manifest_folder(c: Ckpts) -> None:
    c.fs.rm(c.path(NEW, "manifest.json"))
    c.fs.makedirs(c.path(NEW, "manifest.json"), exist_ok=True)
    c.fs.pipe_file(c.path(NEW, "manifest.json/x"), b"x")


@case("manifest.json:deleted", damaged=())  # an interrupted write, not corruption
def _manifest_deleted(c: Ckpts) -> None:
    c.fs.rm(c.path(NEW, "manifest.json"))


def _files_map(fn: Callable[[dict[str, Any]], None], seal: bool = True) -> Corrupt:
    def corrupt(c: Ckpts) -> None:
        man = c.manifest()
        fn(man["files"])
        c.put_manifest(man, seal=seal)
    return corrupt


for _seal in (False, True):
    _s = ":sealed" if _seal else ""
    case(f"files:empty{_s}")(_files_map(lambda f: f.clear(), _seal))
    case(f"files:entry-removed{_s}")(_files_map(lambda f: f.pop("b.safetensors"), _seal))
    case(f"files:entry-added{_s}")(_files_map(
        lambda f: f.__setitem__("c.safetensors", dict(f["b.safetensors"], keys=["c/z"])), _seal))
    case(f"files:bad-name{_s}")(_files_map(
        lambda f: f.__setitem__("../b.safetensors", f.pop("b.safetensors")), _seal))
    case(f"files:key-in-wrong-file{_s}")(_files_map(
        lambda f: f["a.safetensors"]["keys"].append("b/z"), _seal))
    case(f"files:duplicate-key{_s}")(_files_map(
        lambda f: f["a.safetensors"]["keys"].append("a/x"), _seal))
    case(f"files:key-dropped{_s}")(_files_map(lambda f: f["a.safetensors"]["keys"].pop(), _seal))
    case(f"files:key-renamed{_s}")(_files_map(
        lambda f: f["a.safetensors"].__setitem__("keys", ["a/q", "a/y"]), _seal))
case("files:unexpected-key-consistent")(lambda c: c.replace_file(
    NEW, "a.safetensors", {"a/x": LIKE["a/x"], "a/y": LIKE["a/y"], "a/q": torch.zeros(1)}))
case("files:missing-key-consistent")(lambda c: c.replace_file(
    NEW, "a.safetensors", {"a/x": LIKE["a/x"]}))
case("files:wrong-dtype-consistent")(lambda c: c.replace_file(
    NEW, "a.safetensors", {"a/x": LIKE["a/x"].double(), "a/y": LIKE["a/y"]}))
case("files:wrong-shape-consistent")(lambda c: c.replace_file(
    NEW, "a.safetensors", {"a/x": LIKE["a/x"].reshape(3, 2), "a/y": LIKE["a/y"]}))


def _tensor_file(fname: str, fn: Callable[[bytes], bytes]) -> Corrupt:
    return lambda c: c.write(NEW, fname, fn(c.read(NEW, fname)))


for _fname in FILES:
    for _at in (0.0, 0.5, 1.0):
        case(f"{_fname}:flip@{_at}")(_tensor_file(_fname, _flip(_at)))
    case(f"{_fname}:truncated-half")(_tensor_file(_fname, lambda d: d[: len(d) // 2]))
    case(f"{_fname}:truncated-1")(_tensor_file(_fname, lambda d: d[:-1]))
    case(f"{_fname}:empty")(_tensor_file(_fname, lambda d: b""))
    case(f"{_fname}:grown")(_tensor_file(_fname, lambda d: d + b"\0"))
    case(f"{_fname}:other-valid-safetensors")(_tensor_file(
        _fname, lambda d: safetensors.torch.save({"a/x": torch.zeros(2, 3)})))
    case(f"{_fname}:deleted")(lambda c, f=_fname: c.fs.rm(c.path(NEW, f)))

    @case(f"{_fname}:folder")
    def _file_folder(c: Ckpts, f: str = _fname) -> None:
        c.fs.rm(c.path(NEW, f))
        c.fs.makedirs(c.path(NEW, f), exist_ok=True)
        c.fs.pipe_file(c.path(NEW, f"{f}/x"), b"x")

    @case(f"{_fname}:swapped-with-previous", damaged=(NEW, PREV), fallback=OLDEST)
    def _swap(c: Ckpts, f: str = _fname) -> None:
        new, prev = c.read(NEW, f), c.read(PREV, f)
        c.write(NEW, f, prev)
        c.write(PREV, f, new)


@case("manifest.json:swapped-with-previous", damaged=(NEW, PREV), fallback=OLDEST)
def _swap_manifests(c: Ckpts) -> None:
    new, prev = c.read(NEW, "manifest.json"), c.read(PREV, "manifest.json")
    c.write(NEW, "manifest.json", prev)
    c.write(PREV, "manifest.json", new)


@case("folder:copy-of-previous")
def _copy_prev(c: Ckpts) -> None:
    for f in (*FILES, "manifest.json"):
        c.write(NEW, f, c.read(PREV, f))


@case("folder:a-file")
def _folder_file(c: Ckpts) -> None:
    c.fs.rm(c.path(NEW), recursive=True)
    c.fs.pipe_file(c.path(NEW), b"not a folder")


for _extra in ("notes.txt", "evil.safetensors", "manifest.json.bak"):
    case(f"folder:extra-file-{_extra}")(lambda c, e=_extra: c.write(NEW, e, b"x"))


@case("folder:extra-subfolder")
def _extra_subfolder(c: Ckpts) -> None:
    c.fs.makedirs(c.path(NEW, "sub"), exist_ok=True)
    c.write(NEW, "sub/x.safetensors", b"x")


@case("folder:another-runs-checkpoint")
def _foreign(c: Ckpts) -> None:
    other = CheckpointStore(run_location(c.store.url.rsplit("/", 1)[0], "other-run"))
    other.save(NEW, _tensors(99), {"iteration": NEW, "epoch": 0, "offset": NEW})
    src = f"{url_to_fs(other.url)[1].rstrip('/')}/ckpt-{NEW:08d}"
    c.fs.rm(c.path(NEW, "b.safetensors"))  # their files replace mine (same names)
    for f in (*FILES, "manifest.json"):
        c.write(NEW, f, bytes(c.fs.cat_file(f"{src}/{f}")))


@pytest.mark.parametrize("name", sorted(CASES))
def test_store_detects_names_and_falls_back(ckpts: Ckpts, name: str) -> None:
    corrupt, damaged, fallback = CASES[name]
    corrupt(ckpts)
    for step in (NEW, *damaged):
        with pytest.raises(CheckpointCorrupt, match=f"ckpt-{step:08d}"):
            ckpts.store.load(step, like=LIKE, check=CHECK)
    reports: list[str] = []
    got = ckpts.store.load_latest(on_corrupt=reports.append, like=LIKE, check=CHECK)
    assert got is not None, reports
    tensors, info = got
    assert info.step == fallback, reports
    assert all(torch.equal(tensors[k], v) for k, v in _tensors(fallback).items())
    named = {s for s in (NEW, PREV) for r in reports if f"ckpt-{s:08d}" in r}
    assert named == set(damaged), reports
    # The store keeps working: the next save prunes (what is its own) and loads back.
    ckpts.store.save(40, _tensors(40), {"iteration": 40, "epoch": 0, "offset": 40})
    got = ckpts.store.load_latest(like=LIKE, check=CHECK)
    assert got is not None and got[1].step == 40


def test_another_runs_checkpoints_are_never_loaded_nor_pruned(tmp_path: Path) -> None:
    mine = CheckpointStore(run_location(str(tmp_path), "mine"), keep_last=1)
    theirs = CheckpointStore(run_location(str(tmp_path), "theirs"), keep_last=1)
    theirs.save(500, _tensors(500))
    # Their checkpoint copied into my location (a run folder moved by hand).
    src, dst = Path(theirs.url) / "ckpt-00000500", Path(mine.url) / "ckpt-00000500"
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    reports: list[str] = []
    assert mine.load_latest(on_corrupt=reports.append) is None
    assert len(reports) == 1 and "belongs to run theirs" in reports[0]
    for step in (10, 20, 30):
        mine.save(step, _tensors(step))
    assert (dst / "manifest.json").exists() and [i.step for i in mine.list()] == [30]
    assert mine.load_latest()[1].step == 30  # type: ignore[index]
    assert [i.step for i in theirs.list()] == [500]


ASYNC = CheckpointDecision(asynchronous=True)  # a full save, persisted in the background


# -- inside recovering runs -------------------------------------------------------------
def _newest_two(folder: Path, tag: str) -> tuple[Path, int | None]:
    """The newest checkpoint folder of ``tag`` under the only run location, and the step
    of the one before it."""
    (loc,) = folder.glob("run-*")
    names = sorted(p for p in loc.iterdir() if p.name.startswith(f"{tag}-") and ".tmp-" not in p.name)
    prev = int(names[-2].name.rsplit("-", 1)[1]) if len(names) > 1 else None
    return names[-1], prev


def _flip_tensor_byte(ckpt: Path) -> None:
    f = sorted(ckpt.glob("*.safetensors"))[0]
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))


def _infinite_step(ckpt: Path) -> None:
    m = ckpt / "manifest.json"
    m.write_text(m.read_text().replace(f'"step": {int(ckpt.name.rsplit("-", 1)[1])}',
                                       '"step": Infinity'))


def _empty_files(ckpt: Path) -> None:
    man = json.loads((ckpt / "manifest.json").read_text())
    man["files"] = {}
    (ckpt / "manifest.json").write_text(json.dumps(man))


def _folder_to_file(ckpt: Path) -> None:
    for f in ckpt.iterdir():
        f.unlink()
    ckpt.rmdir()
    ckpt.write_text("not a folder")


IN_RUN: dict[str, Callable[[Path], None]] = {
    "flipped-byte": _flip_tensor_byte, "step-infinity": _infinite_step,
    "empty-files": _empty_files, "file-for-folder": _folder_to_file,
    "tensor-file-deleted": lambda p: sorted(p.glob("*.safetensors"))[0].unlink(),
}


class CorruptAtFailure(Callback):
    """At the first failure, corrupts the newest checkpoint of ``tag``, before any restore."""

    def __init__(self, folder: Path, tag: str, how: Callable[[Path], None]) -> None:
        self.folder, self.tag, self.how = folder, tag, how
        self.corrupted: str | None = None
        self.expected: int | None = None

    def on_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "failure" and self.corrupted is None:
            newest, self.expected = _newest_two(self.folder, self.tag)
            self.corrupted = newest.name
            self.how(newest)


def _run(tmp_path: Path, cb: CorruptAtFailure, **kw: Any) -> tuple[RunResult, list[dict]]:
    summary = run(RunConfig(checkpoint_dir=str(cb.folder), **kw), tmp_path / "run", [cb])
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    return summary.result, events


def _assert_skipped(cb: CorruptAtFailure, result: RunResult, events: list[dict]) -> None:
    assert cb.corrupted is not None and cb.expected is not None
    skipped = [e["message"] for e in events if e["type"] == "checkpoint-corrupt"]
    assert skipped and all(cb.corrupted in m for m in skipped), skipped
    assert result.converged, result
    assert result.failures == 1


@pytest.mark.parametrize("how", sorted(IN_RUN))
def test_sim_parameter_server_resumes_from_the_previous_checkpoint(tmp_path: Path,
                                                                    how: str) -> None:
    # Each shard saves itself (tag shard<i>); shard 0's newest is corrupted, so the
    # rollback of every shard lands on the previous checkpoint for all of them.
    cb = CorruptAtFailure(tmp_path / "ck", "shard0", IN_RUN[how])
    result, events = _run(tmp_path, cb, workload="mlr", strategy="checkpoint-restart",
                           checkpoint_every=50, failures=["shards=50%@iter=230"], seed=1)
    _assert_skipped(cb, result, events)
    assert cb.corrupted == "shard0-00000200" and cb.expected == 150
    assert result.recoveries[0].restored_from == 150


def test_sim_data_parallel_resumes_from_the_previous_checkpoint(tmp_path: Path) -> None:
    cb = CorruptAtFailure(tmp_path / "ck", "ckpt", _flip_tensor_byte)
    result, events = _run(tmp_path, cb, paradigm="dp", strategy="checkpoint-restart",
                           checkpoint_every=10, failures=["rank=1@iter=25"])
    _assert_skipped(cb, result, events)
    assert cb.corrupted == "ckpt-00000020" and cb.expected == 10
    assert result.recoveries[0].restored_from == 10


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("ray_session")
def test_ray_shard_is_restored_from_the_previous_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    cb = CorruptAtFailure(tmp_path / "ck", "shard0", _flip_tensor_byte)
    result, events = _run(tmp_path, cb, workload="mlr", strategy="checkpoint-sync",
                           engine="ray", shards=1, workers=2, consistency="async",
                           target=0.35, eval_every=5, checkpoint_every=5, recovery_delay=0.5,
                           failures=["shards=0@iter=30"], wall_limit=60.0)
    _assert_skipped(cb, result, events)
    up = [e for e in events if e["type"] == "up"]
    assert up and up[0]["restored_from"] == cb.expected, (cb.corrupted, up)


@pytest.mark.timeout(180)
def test_dist_ranks_restart_from_the_previous_checkpoint(tmp_path: Path) -> None:
    cb = CorruptAtFailure(tmp_path / "ck", "ckpt", _flip_tensor_byte)
    result, events = _run(tmp_path, cb, engine="dist", paradigm="dp", ranks=2,
                           strategy="checkpoint-restart", checkpoint_every=5,
                           failures=["rank=1@iter=12"], target=0.3, max_iterations=400,
                           wall_limit=120)
    _assert_skipped(cb, result, events)
    assert cb.corrupted == "ckpt-00000010" and cb.expected == 5
    assert result.recoveries[0].restored_from == 5


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("ray_session")
def test_ray_shard_checkpoints_never_race_nor_drop_silently(tmp_path: Path) -> None:
    """Concurrent async checkpoint calls on one threaded actor: each is either written
    or reported skipped (a write was still running), never both and never silently
    lost; a failed write is reported by the next call instead of vanishing."""
    ray = pytest.importorskip("ray")
    from trainthrough.engines.ray.actors.shard_actor import ShardActor
    from trainthrough.ps.layout import make_layout
    from trainthrough.workloads.base import OptimizerSpec

    values = {"x": torch.zeros(64, 8)}
    actor = ShardActor.remote(0, make_layout(values, 1).shards[0], OptimizerSpec(kind="add"),
                              values, "r0")
    url = run_location(str(tmp_path), "race")
    results = ray.get([actor.checkpoint.remote(url, 50, 0, ASYNC, step) for step in range(1, 41)])
    # A restore waits for the write still in flight: after it every save not skipped exists.
    got = ray.get(actor.restore.remote(url, 50, 0))
    assert all("error" not in r for r in results) and "error" not in got, results
    written = sorted(int(r["name"].rsplit("-", 1)[1]) for r in results if r["name"])
    assert all(bool(r["name"]) != r["skipped"] for r in results), results
    assert written and got == {"step": max(written), "skipped": []}
    assert [i.step for i in CheckpointStore(url).list("shard0")] == written
    stats = ray.get(actor.checkpoint_stats.remote())
    assert stats["writes"] == len(written) and stats["skipped"] == 40 - len(written)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    bad = run_location(str(blocker), "race")  # under a file: the persist must fail
    assert "error" not in ray.get(actor.checkpoint.remote(bad, 3, 0, ASYNC, 41))
    # The restore waits for that write and reports its failure.
    failed = ray.get(actor.restore.remote(url, 50, 0))
    assert "shard0-00000041 could not be written" in failed["error"], failed
    assert ray.get(actor.checkpoint.remote(url, 50, 0, ASYNC, 42))["name"]
    assert ray.get(actor.restore.remote(url, 50, 0)) == {"step": 42, "skipped": []}
    ray.kill(actor)


def _shard_in_process() -> Any:
    """A shard actor's class run in this process (its threads, no Ray), on 64 x 8 zeros."""
    from trainthrough.engines.ray.actors.shard_actor import ShardActor
    from trainthrough.ps.layout import make_layout
    from trainthrough.workloads.base import OptimizerSpec

    threads = torch.get_num_threads()
    values = {"x": torch.zeros(64, 8)}
    actor = ShardActor.__ray_actor_class__(0, make_layout(values, 1).shards[0],
                                           OptimizerSpec(kind="add"), values, "r0")
    torch.set_num_threads(threads)  # the actor's __init__ pins this process to one
    return actor


def test_an_async_save_due_while_a_write_runs_is_skipped_never_overlapped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The persister holds one write at a time: a save that falls due while the previous
    write is still running is skipped and counted, and the two never overlap."""
    import threading

    pytest.importorskip("ray")
    from trainthrough.ft.shard_checkpoint import ShardCheckpoint

    actor = _shard_in_process()
    release, inside = threading.Event(), threading.Event()
    running, most = [0], [0]
    write = ShardCheckpoint.write

    def slow_write(self: ShardCheckpoint, p: Any) -> Any:
        running[0] += 1
        most[0] = max(most[0], running[0])
        inside.set()
        release.wait(10)
        try:
            return write(self, p)
        finally:
            running[0] -= 1

    monkeypatch.setattr(ShardCheckpoint, "write", slow_write)
    url = run_location(str(tmp_path), "overlap")
    first = actor.checkpoint(url, 50, 0, ASYNC, 1)
    assert first["name"] and inside.wait(10)
    second = actor.checkpoint(url, 50, 0, ASYNC, 2)  # the first is still writing
    assert second["skipped"] and second["name"] is None
    release.set()
    assert actor.restore(url, 50, 0) == {"step": 1, "skipped": []}
    third = actor.checkpoint(url, 50, 0, ASYNC, 3)
    assert third["name"] and not third["skipped"]
    assert actor.restore(url, 50, 0)["step"] == 3
    assert most[0] == 1
    stats = actor.checkpoint_stats()
    assert (stats["writes"], stats["skipped"]) == (2, 1)
    assert [i.step for i in CheckpointStore(url).list("shard0")] == [1, 3]


def test_shard_checkpoint_calls_wait_for_a_persist_that_has_not_started_yet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The red team's race, made deterministic in-process: a persist thread slow to
    start while the next checkpoint call arrives. It used to raise "cannot join thread
    before it is started" and drop that checkpoint."""
    import threading
    import time

    pytest.importorskip("ray")
    actor = _shard_in_process()
    start = threading.Thread.start

    def slow_start(self: threading.Thread) -> None:
        time.sleep(0.05)
        start(self)

    url = run_location(str(tmp_path), "race")
    errors: list[BaseException] = []

    results: list[dict[str, Any]] = []

    def call(step: int) -> None:
        try:
            results.append(actor.checkpoint(url, 50, 0, ASYNC, step))
            assert "error" not in results[-1]
        except BaseException as e:  # reported below
            errors.append(e)

    callers = [threading.Thread(target=call, args=(s,)) for s in range(1, 9)]
    monkeypatch.setattr(threading.Thread, "start", slow_start)
    for t in callers:
        start(t)
        time.sleep(0.02)
    for t in callers:
        t.join()
    # Each call was written or reported skipped (a write still running), none lost.
    written = sorted(int(r["name"].rsplit("-", 1)[1]) for r in results if r["name"])
    assert len(results) == 8 and all(bool(r["name"]) != r["skipped"] for r in results)
    assert actor.restore(url, 50, 0) == {"step": max(written), "skipped": []} and errors == []
    assert [i.step for i in CheckpointStore(url).list("shard0")] == written
