"""Tests for the crash-consistent checkpoint store (local disk and memory://)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from fsspec.core import url_to_fs

from trainthrough.config import RunConfig
from trainthrough.errors import CheckpointCorrupt, CheckpointWriteFailed, UserError
from trainthrough.ft.checkpoint import FORMAT, CheckpointInfo, CheckpointStore, run_location
from trainthrough.lab.runner import _scratch_checkpoints, run


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path_factory.mktemp("ckpts") / "run")
    else:
        u = f"memory://ckpt-test-{uuid.uuid4().hex}"
        yield u
        fs, root = url_to_fs(u)
        if fs.exists(root):
            fs.rm(root, recursive=True)


def _fs(url: str) -> tuple[object, str]:
    fs, root = url_to_fs(url)
    return fs, root.rstrip("/")


def _entries(url: str) -> list[str]:
    fs, root = _fs(url)
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))


def _tensors(seed: float = 0.0) -> dict[str, torch.Tensor]:
    base = torch.arange(12, dtype=torch.float32) + seed
    return {"shard0/W": base.view(3, 4), "shard1/b": base[:4] * 2, "scalar": torch.tensor(seed)}


def _steps(store: CheckpointStore, tag: str = "ckpt") -> list[int]:
    return [i.step for i in store.list(tag)]


def test_round_trip_dtypes_shapes(url: str) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 5, generator=g, requires_grad=True)
    flat = torch.arange(10, dtype=torch.float64)
    tensors = {
        "f32": torch.randn(3, 4, generator=g),
        "f64": torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        "f16": torch.randn(7, generator=g).half(),
        "bf16": torch.randn(2, 2, generator=g).bfloat16(),
        "i64": torch.arange(-5, 5),
        "i32": torch.arange(6, dtype=torch.int32).view(2, 3),
        "u8": torch.arange(256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "model/w": w,  # requires grad -> saved detached
        "model/wT": w.t(),  # non-contiguous view sharing storage with w
        "opt/flat_a": flat[:5],  # two views into one storage
        "opt/flat_b": flat[5:],
    }
    store = CheckpointStore(url)
    info = store.save(7, tensors, {"loss": 0.25, "tags": ["a"]})
    assert info == CheckpointInfo(7, "ckpt-00000007", info.nbytes, {"loss": 0.25, "tags": ["a"]})
    assert set(_entries(f"{url}/ckpt-00000007")) == {
        "manifest.json",
        "root.safetensors",
        "model.safetensors",
        "opt.safetensors",
    }
    loaded, linfo = store.load(7)
    assert linfo == info
    assert set(loaded) == set(tensors)
    for k, t in tensors.items():
        assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape, k
        assert torch.equal(loaded[k], t.detach()), k
        assert not loaded[k].requires_grad
    assert store.load_latest() is not None


def test_keep_last_prunes_oldest_after_success(url: str) -> None:
    store = CheckpointStore(url, keep_last=2)
    for step in (10, 20, 30, 40):
        store.save(step, _tensors(step), {"step": step})
        assert _steps(store) == [s for s in (10, 20, 30, 40) if s <= step][-2:]
    assert _entries(url) == ["ckpt-00000030", "ckpt-00000040"]
    tensors, info = store.load_latest()  # type: ignore[misc]
    assert info.step == 40 and info.meta == {"step": 40}
    assert torch.equal(tensors["shard0/W"], _tensors(40)["shard0/W"])


def test_keep_last_is_per_tag_and_keeps_the_new_write(url: str) -> None:
    store = CheckpointStore(url, keep_last=1)
    store.save(300, _tensors(3))
    store.save(5, _tensors(5), tag="best")
    store.save(250, _tensors(2))  # after a rollback: the new write wins over a higher step
    assert _steps(store) == [250]
    assert _steps(store, "best") == [5]
    with pytest.raises(ValueError):
        CheckpointStore(url, keep_last=0)


def test_same_step_replaced(url: str) -> None:
    store = CheckpointStore(url)
    store.save(10, _tensors(1.0))
    store.save(10, _tensors(2.0), {"v": 2})
    assert _entries(url) == ["ckpt-00000010"]
    tensors, info = store.load(10)
    assert info.meta == {"v": 2}
    assert torch.equal(tensors["shard1/b"], _tensors(2.0)["shard1/b"])


def _corrupt_byte(url: str, name: str, fname: str) -> None:
    fs, root = _fs(url)
    path = f"{root}/{name}/{fname}"
    data = bytearray(fs.cat_file(path))
    data[-1] ^= 0xFF  # flip a payload byte: same size, different hash
    fs.pipe_file(path, bytes(data))


def test_checksum_corruption_falls_back(url: str) -> None:
    store = CheckpointStore(url)
    store.save(10, _tensors(10))
    store.save(20, _tensors(20))
    _corrupt_byte(url, "ckpt-00000020", "shard0.safetensors")
    with pytest.raises(CheckpointCorrupt, match=r"ckpt-00000020.*shard0\.safetensors.*crc32"):
        store.load(20)
    reports: list[str] = []
    tensors, info = store.load_latest(on_corrupt=reports.append)  # type: ignore[misc]
    assert info.step == 10
    assert torch.equal(tensors["shard0/W"], _tensors(10)["shard0/W"])
    assert len(reports) == 1 and "ckpt-00000020" in reports[0]
    assert issubclass(CheckpointCorrupt, UserError)


def test_truncated_and_missing_files(url: str) -> None:
    store = CheckpointStore(url)
    store.save(10, _tensors(10))
    store.save(20, _tensors(20))
    store.save(30, _tensors(30))
    fs, root = _fs(url)
    path = f"{root}/ckpt-00000030/shard1.safetensors"
    fs.pipe_file(path, fs.cat_file(path)[:-9])
    fs.rm(f"{root}/ckpt-00000020/root.safetensors")
    with pytest.raises(CheckpointCorrupt, match=r"ckpt-00000030.*shard1\.safetensors.*truncated"):
        store.load(30)
    with pytest.raises(CheckpointCorrupt, match=r"ckpt-00000020.*root\.safetensors is missing"):
        store.load(20)
    reports: list[str] = []
    result = store.load_latest(on_corrupt=reports.append)
    assert result is not None and result[1].step == 10
    assert ["ckpt-00000030" in reports[0], "ckpt-00000020" in reports[1]] == [True, True]
    with pytest.raises(CheckpointCorrupt, match="does not exist"):
        store.load(99)


def test_bad_manifest_is_reported(url: str) -> None:
    store = CheckpointStore(url)
    store.save(1, _tensors(1))
    store.save(2, _tensors(2))
    fs, root = _fs(url)
    fs.pipe_file(f"{root}/ckpt-00000002/manifest.json", b"{not json")
    assert _steps(store) == [1, 2]  # manifest present -> listed, but fails to load
    with pytest.raises(CheckpointCorrupt, match="unreadable manifest.json"):
        store.load(2)
    reports: list[str] = []
    result = store.load_latest(on_corrupt=reports.append)
    assert result is not None and result[1].step == 1 and "ckpt-00000002" in reports[0]


def test_interrupted_write_leaves_previous_intact(url: str) -> None:
    store = CheckpointStore(url, keep_last=1)
    store.save(10, _tensors(10))
    fs, root = _fs(url)
    # Crash 1: tensor files written into the temp folder, no manifest, no rename.
    fs.makedirs(f"{root}/ckpt-00000020.tmp-deadbeef", exist_ok=True)
    fs.copy(f"{root}/ckpt-00000010/shard0.safetensors", f"{root}/ckpt-00000020.tmp-deadbeef/")
    # Crash 2: final-named folder without a manifest (e.g. non-atomic rename / half delete).
    fs.makedirs(f"{root}/ckpt-00000030", exist_ok=True)
    fs.pipe_file(f"{root}/ckpt-00000030/shard0.safetensors", b"partial")
    assert _entries(url) == ["ckpt-00000010", "ckpt-00000020.tmp-deadbeef", "ckpt-00000030"]
    assert _entries(f"{url}/ckpt-00000020.tmp-deadbeef") == ["shard0.safetensors"]
    assert _steps(store) == [10]
    reports: list[str] = []
    result = store.load_latest(on_corrupt=reports.append)
    assert result is not None and result[1].step == 10 and reports == []
    with pytest.raises(CheckpointCorrupt, match="no manifest.json"):
        store.load(30)
    # The next successful save cleans the leftovers (and prunes step 10, keep_last=1).
    store.save(40, _tensors(40))
    assert _entries(url) == ["ckpt-00000040"]


def test_bytes_accounting_matches_storage(url: str) -> None:
    store = CheckpointStore(url, keep_last=1)
    infos = [store.save(s, _tensors(s), {"s": s}) for s in (1, 2, 3)]
    fs, root = _fs(url)
    on_disk = sum(fs.size(p) for p in fs.find(f"{root}/ckpt-00000003"))
    assert infos[-1].nbytes == on_disk
    assert store.list()[-1].nbytes == on_disk
    assert store.total_bytes_written() == sum(i.nbytes for i in infos)
    manifest = json.loads(fs.cat_file(f"{root}/ckpt-00000003/manifest.json"))
    assert manifest["format"] == FORMAT and manifest["step"] == 3
    assert set(manifest["files"]["shard0.safetensors"]) == {"crc32", "bytes", "keys"}


def test_a_local_file_is_started_on_disk_as_written_and_keeps_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local file of several writeback chunks has the disk started on it as it is
    written (once per chunk), and its bytes stay exactly safetensors' own; an in-memory
    file has no descriptor and is never started."""
    import io
    import zlib

    import safetensors.torch

    from trainthrough.ft.checkpoint import stream, writeback

    started: list[int] = []
    real = writeback.start
    monkeypatch.setattr(writeback, "start", lambda fd: (started.append(fd), real(fd)))
    chunks = 3
    tensors = {"w": torch.randn(chunks * writeback.CHUNK // 4 + 5), "b": torch.ones(3)}
    with open(tmp_path / "t.safetensors", "wb") as f:
        crc, size = stream.write(f, tensors)
        fd = f.fileno()
    ref = safetensors.torch.save(tensors)
    assert (tmp_path / "t.safetensors").read_bytes() == ref and size == len(ref)
    assert crc == f"{zlib.crc32(ref):08x}"
    assert started == [fd] * chunks
    started.clear()
    stream.write(io.BytesIO(), tensors)
    assert started == []


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_every_file_is_fsynced_before_the_rename_and_a_failed_fsync_fails_the_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, large: bool) -> None:
    """Crash consistency: every tensor file and the manifest are fsynced (under the temp
    name) before the folder is renamed, and the folder holding it after; an fsync that
    fails fails the save, which leaves no checkpoint and no temp folder behind. Large
    files take the early-sync path (fsynced while their checksum finishes)."""
    from trainthrough.ft.checkpoint import durable, stream

    events: list[tuple[str, str]] = []
    real = durable.fsync_path
    fail: list[str] = []

    def fsync(path: str) -> None:
        if any(path.endswith(f) for f in fail):
            raise OSError(5, "injected fsync failure", path)
        real(path)
        events.append(("fsync", path))

    monkeypatch.setattr(durable, "fsync_path", fsync)
    root = tmp_path / "ck"
    store = CheckpointStore(str(root), keep_last=3)
    real_mv = store._fs.mv
    monkeypatch.setattr(store._fs, "mv", lambda a, b, **kw: (events.append(("mv", b)),
                                                               real_mv(a, b, **kw)))
    n = stream.PARALLEL_BYTES // 4 + 10 if large else 3
    tensors = {"value/w": torch.randn(n), "opt/m": torch.randn(n), "step": torch.ones(1)}
    store.save(1, tensors)
    mv = events.index(("mv", str(root / "ckpt-00000001")))
    synced = {Path(p).name for kind, p in events[:mv] if kind == "fsync"}
    assert synced == {"value.safetensors", "opt.safetensors", "root.safetensors",
                      "manifest.json"}
    assert all(".tmp-" in Path(p).parent.name for kind, p in events[:mv])
    assert events[mv + 1:] == [("fsync", str(root))]

    fail.append("manifest.json")
    with pytest.raises(CheckpointWriteFailed, match="ckpt-00000002 could not be written "
                       ".*injected fsync failure"):
        store.save(2, tensors)
    assert [i.step for i in store.list()] == [1]
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-00000001"]
    fail.clear()
    assert set(store.load_latest()[0]) == set(tensors)  # type: ignore[index]


def test_a_signal_while_the_fsync_pool_starts_does_not_hang_the_exit(tmp_path: Path) -> None:
    """CI hung a SIGTERMed run at exit: the signal, raised in the main thread while the
    fsync pool started a thread, left a worker the interpreter joined forever. Here the
    start is interrupted on purpose (as the handler's exception would, right after the
    thread began); the pool still syncs, and the process exits."""
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import sys, threading\n"
        "from trainthrough.ft.checkpoint import durable\n"
        "real = threading.Event.wait\n"
        "def wait(self, timeout=None):\n"
        "    threading.Event.wait = real\n"
        "    real(self, timeout)\n"
        "    raise KeyboardInterrupt('SIGTERM while a thread starts')\n"
        "threading.Event.wait = wait\n"
        "try:\n"
        "    durable.Syncing([sys.argv[1]]).wait()\n"
        "    raise SystemExit('the start was not interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "if sys.argv[2] == 'again':  # the pool still works after the interruption\n"
        "    durable.Syncing([sys.argv[1]]).wait()\n"
        "print('exits')\n")
    (tmp_path / "f").write_bytes(b"x")
    for then in ("exit", "again"):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "f"), then],
                              capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, "exits\n"), (then, done.stderr)


def test_checkpoints_of_the_sha256_format_still_load_and_verify(tmp_path: Path) -> None:
    """Format /2 (files checked by sha256, written before CRC-32) is read, as strictly:
    a flipped byte fails its sha256 check, and a /2 manifest naming crc32 is refused."""
    import hashlib

    from trainthrough.ft.checkpoint.manifest import checksum

    store = CheckpointStore(str(tmp_path / "ck"), keep_last=3)
    tensors = _tensors(2.0)
    store.save(7, tensors, {"iteration": 7})
    folder = tmp_path / "ck" / "ckpt-00000007"
    man = json.loads((folder / "manifest.json").read_text())
    assert man["format"] == FORMAT != "trainthrough-checkpoint/2"
    man["format"] = "trainthrough-checkpoint/2"
    for name, entry in man["files"].items():
        del entry["crc32"]
        entry["sha256"] = hashlib.sha256((folder / name).read_bytes()).hexdigest()

    def seal(doc: dict[str, object]) -> None:
        doc = {k: v for k, v in doc.items() if k != "checksum"}
        doc["checksum"] = checksum(doc)
        (folder / "manifest.json").write_text(json.dumps(doc, indent=1, sort_keys=True))

    seal(man)
    loaded, info = store.load(7)
    assert info.meta == {"iteration": 7}
    assert set(loaded) == set(tensors)
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    f = folder / "shard0.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match=r"shard0\.safetensors fails its sha256"):
        store.load(7)
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    store.load(7)  # whole again
    entry = man["files"]["shard0.safetensors"]
    entry["crc32"] = entry.pop("sha256")[:8]  # the new checksum under the old format
    seal(man)
    with pytest.raises(CheckpointCorrupt, match="must hold exactly"):
        store.load(7)


def test_load_never_unpickles(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(url)
    store.save(1, _tensors(1))

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpickling is forbidden")

    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    assert store.load_latest() is not None


def test_background_saves_while_loading(url: str) -> None:
    store = CheckpointStore(url, keep_last=2)
    store.save(0, _tensors(0))
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for step in range(1, 16):
                store.save(step, _tensors(step))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    reports: list[str] = []
    while t.is_alive():
        result = store.load_latest(on_corrupt=reports.append)
        assert result is not None
        tensors, info = result
        assert torch.equal(tensors["shard0/W"], _tensors(info.step)["shard0/W"])
    t.join()
    assert errors == [] and reports == []
    assert _steps(store) == [14, 15]


# -- one run's checkpoints are its own (runs sharing --checkpoint-dir) --------------------
def _ckpt_steps(location: Path) -> list[int]:
    """Steps of the run's full checkpoints (every shard saves itself: shard 0's)."""
    return sorted(int(p.name.rsplit("-", 1)[1]) for p in location.glob("shard0-[0-9]*"))


def test_user_files_in_a_tt_ckpt_folder_survive_the_run(tmp_path: Path) -> None:
    mine = tmp_path / "tt-ckpt-mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    s = run(RunConfig(workload="ridge", checkpoint_every=20, failures=["shards=1@iter=50"],
                      checkpoint_dir=str(mine)), tmp_path / "run")
    assert (mine / "notes.txt").read_text() == "precious"
    assert s.checkpoint_url == run_location(str(mine), s.run_id)
    assert _ckpt_steps(Path(s.checkpoint_url))  # the run's own checkpoints are kept too


def test_scratch_checkpoints_remove_only_what_they_created(tmp_path: Path) -> None:
    user = Path(tempfile.gettempdir()) / f"tt-ckpt-user-{uuid.uuid4().hex}"
    user.mkdir()
    try:
        with _scratch_checkpoints("dist") as url:
            made = Path(url).parent
            assert made.name.startswith("tt-ckpt-") and made != user
            CheckpointStore(url).save(1, _tensors(1))
        assert not made.exists() and user.exists()
        with _scratch_checkpoints("sim") as url:
            CheckpointStore(url).save(1, _tensors(1))
        assert not url_to_fs(url)[0].exists(url_to_fs(url)[1])
    finally:
        user.rmdir()


def test_runs_sharing_a_checkpoint_dir_never_see_each_others_checkpoints(tmp_path: Path) -> None:
    shared = tmp_path / "ck"
    cfg = RunConfig(workload="mlr", checkpoint_every=50, seed=1, checkpoint_dir=str(shared))
    a = run(replace(cfg, max_iterations=700), tmp_path / "a")
    a_loc = Path(a.checkpoint_url)
    assert _ckpt_steps(a_loc) == [550, 600, 650]
    # B fails at 230: it restores its own 200, not A's 650, and prunes none of A's.
    b = run(replace(cfg, failures=["shards=50%@iter=230"]), tmp_path / "b")
    assert b.result.recoveries[0].restored_from == 200 and b.result.converged
    assert b.run_id != a.run_id and _ckpt_steps(a_loc) == [550, 600, 650]
    b_steps = _ckpt_steps(Path(b.checkpoint_url))
    assert len(b_steps) == 3
    # Another workload in the same folder (its keys differ: it used to crash), and A again.
    c = run(RunConfig(workload="ridge", checkpoint_every=20, failures=["shards=1@iter=50"],
                      checkpoint_dir=str(shared)), tmp_path / "c")
    assert c.result.recoveries[0].restored_from == 40 and c.result.converged
    run(replace(cfg, max_iterations=700), tmp_path / "a2")
    assert _ckpt_steps(a_loc) == [550, 600, 650]
    assert _ckpt_steps(Path(b.checkpoint_url)) == b_steps
    assert len(list(shared.glob("run-*"))) == 4


def test_in_memory_only_what_the_run_created_is_freed(tmp_path: Path) -> None:
    fs = url_to_fs("memory://")[0]
    theirs = f"/tt-user-{uuid.uuid4().hex}"
    fs.pipe_file(f"{theirs}/keep.txt", b"x")
    s = run(RunConfig(workload="ridge", checkpoint_dir=f"memory://{theirs}"), tmp_path / "a")
    assert fs.exists(f"{theirs}/keep.txt") and not fs.exists(url_to_fs(s.checkpoint_url)[1])
    fresh = f"memory://tt-new-{uuid.uuid4().hex}"
    run(RunConfig(workload="ridge", checkpoint_dir=fresh), tmp_path / "b")
    assert not fs.exists(url_to_fs(fresh)[1])
    fs.rm(theirs, recursive=True)


def test_streamed_tensor_files_are_byte_for_byte_what_safetensors_writes() -> None:
    """The store writes tensor files itself (no in-memory copy of the file, hashed as
    written); the bytes and checksum must be exactly safetensors' own."""
    import io
    import zlib

    import safetensors.torch

    from trainthrough.ft.checkpoint import stream

    dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
    tensors = {f"g{i % 3}/{chr(97 + i)}": torch.ones(i + 1, 2, dtype=d)
               for i, d in enumerate(dtypes)}
    tensors |= {"value/w": torch.randn(3, 4), "opt/empty": torch.zeros(0),
                "scalar": torch.tensor(3.0), "a": torch.ones(2, dtype=torch.bool)}
    assert stream.streamable(tensors)
    f = io.BytesIO()
    sha, size = stream.write(f, tensors)
    ref = safetensors.torch.save(tensors)
    assert f.getvalue() == ref and size == len(ref)
    assert sha == f"{zlib.crc32(ref):08x}"


def test_a_large_checkpoint_hashed_while_its_files_sync_loads_and_verifies(tmp_path) -> None:  # noqa: ANN001
    """Files of at least ``stream.PARALLEL_BYTES`` are hashed on a thread while the store
    fsyncs them: the bytes, checksums and manifest are the same as safetensors' own."""
    import io
    import zlib

    import safetensors.torch

    from trainthrough.ft.checkpoint import stream

    n = stream.PARALLEL_BYTES // 4 + 1000  # float32: just past the threshold
    big = {"value/w": torch.randn(n), "value/b": torch.randn(7)}
    f = io.BytesIO()
    sha, size = stream.write(f, big)
    ref = safetensors.torch.save(big)
    assert f.getvalue() == ref and sha == f"{zlib.crc32(ref):08x}"

    store = CheckpointStore(str(tmp_path / "ck"), keep_last=2)
    tensors = {**big, "opt/m": torch.randn(n), "step": torch.tensor([5])}
    store.save(5, tensors, {"iteration": 5})
    loaded, info = store.load_latest()  # type: ignore[misc]
    assert info.step == 5 and set(loaded) == set(tensors)
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    path = tmp_path / "ck" / "ckpt-00000005" / "value.safetensors"
    path.write_bytes(path.read_bytes()[:-4] + b"\0\0\0\1")  # a flipped tail: caught
    with pytest.raises(CheckpointCorrupt, match="crc32"):
        store.load(5)


def test_the_checkpointer_counts_every_save_a_write_failed_in() -> None:
    """A save some shards wrote and one could not is a checkpoint and a failed save; one
    none wrote is only a failed save; each failed write is an event of its own."""
    from trainthrough.ft.checkpointer import Checkpointer, SaveReport
    from trainthrough.ft.checkpointing import FullEvery
    from trainthrough.ft.decisions import CheckpointDecision

    reports = iter([SaveReport(10, 8, 0.0, ["shard0-00000002", "shard1-00000002"]),
                    SaveReport(5, 8, 0.0, ["shard0-00000004"], ["shard1 full"]),
                    SaveReport(0, 8, 0.0, [], ["shard0 full", "shard1 full"])])

    class Backend:
        def save(self, d: CheckpointDecision, iteration: int, done: Any) -> None:
            done(next(reports))

    events: list[dict[str, Any]] = []
    ck = Checkpointer(FullEvery(2), Backend(), lambda e: events.append(e.to_record()))
    ck.after_iteration(6)
    assert (ck.count, ck.failed, ck.bytes) == (2, 2, 15)
    assert [e["iteration"] for e in events if e["type"] == "checkpoint-failed"] == [4, 6, 6]
