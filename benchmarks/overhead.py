"""Failure-free overhead of each strategy on Ray, as throughput relative to no fault tolerance.

Each strategy trains cnn on Ray (1 shard, 4 asynchronous workers, chains of 3) for the
same wall time with no failure, all on one Ray cluster. Throughput is updates applied
(acknowledged pushes) per second of training, counted from the moment every actor is
up, so start-up is not in it.

The method, so that noise shows instead of passing for a result:

* one warm-up run of each strategy first (not counted): the first run on a fresh
  cluster pays for cold caches and Ray's own start-up work, and the first run of a
  chain for its replicas' start;
* before every run, a wait until the cluster is quiet: Ray tears the last run's
  actors down and starts idle worker processes, which took up to 0.7 of a core into
  the next run when runs followed each other at once;
* then ``--repeats`` repetitions (default 5); each runs every strategy once, in an
  order shuffled per repetition (seeded), so no strategy always runs first or last;
* each strategy's ratio is taken against ``none`` *of the same repetition* (paired),
  and the median ratio is printed with the spread (min-max and interquartile range)
  of those ratios, and ``none``'s own spread: a ratio further from 1 than that
  spread is a measurement, one within it is noise;
* a strategy that beats ``none`` by more than the noise is flagged: doing more work
  cannot be faster, so such a run says "rerun on a quieter machine", not "free".

Checkpoint-async is also measured against the disk: the same checkpoint (the cnn
shard's state, through the same store and write code as the actors) is written
interleaved with plain writes of a new file of the same size, in the same file system:
a crash-safe one (temp file, fsync, rename, folder fsync: the two durable rounds a
checkpoint needs too), a bare write + fsync (one round, the disk's floor), and the
checkpoint's own layout (as many files of the same sizes, in a temp folder renamed into
place) written plainly: what the layout costs, apart from our code. Times and
ratios (bandwidth reached) are printed at the checkpoint's own size and at
``--mid-mb`` and ``--large-mb`` (where bandwidth, not sync latency, counts); the prune that follows a
save (deleting the oldest checkpoint) is printed apart, as the plain writes' deletes
are not timed. ``--disk-only`` runs just this part (seconds, no Ray).

    flock /tmp/tt-bench.lock python benchmarks/overhead.py [--seconds 6] [--repeats 5]
    flock /tmp/tt-bench.lock python benchmarks/overhead.py --strategies chain-sync,chain-async
    flock /tmp/tt-bench.lock python benchmarks/overhead.py --disk-only

Defaults: 36 runs of 6 s (6 warm-ups), each after the wait for a quiet cluster; with
the warm actor pool, ``--strategies chain-sync,chain-async --repeats 3`` took 86 s
(with the single warm-up it had then).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
import zlib

import torch

from trainthrough.config import RunConfig
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.engines.result import RunResult
from trainthrough.ft.checkpoint.durable import Syncing, fsync_path
from trainthrough.lab.runner import run_silent
from trainthrough.lab.validate import for_strategy

STRATEGIES = ("none", "checkpoint-sync", "checkpoint-async", "chain-sync", "chain-async",
              "stateless")
# (strategy, how the target reads, does the median ratio meet it)
TARGETS = (("checkpoint-async", "overhead <= 3%", lambda r: r >= 0.97),
           ("chain-sync", ">= 0.8x none", lambda r: r >= 0.8),
           ("chain-async", ">= 0.9x none", lambda r: r >= 0.9))
BANDWIDTH_TARGET = 0.8


def _cluster_cpu_seconds() -> float | None:
    """CPU seconds used so far by this process's descendants (the Ray cluster it
    started: raylet, workers being started or torn down). None off Linux."""
    hz = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
    except OSError:
        return None
    total, todo = 0.0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / hz
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


def settle(limit: float = 20.0) -> float:
    """Wait until the cluster is quiet (< 0.1 core over half a second), at most
    ``limit`` seconds; return the wait. After a run Ray tears actors down and starts
    idle worker processes (importing Ray and torch: a core for seconds); a run started
    meanwhile would pay for its predecessor."""
    t0 = time.perf_counter()
    before = _cluster_cpu_seconds()
    if before is None:
        time.sleep(3.0)
        return 3.0
    while time.perf_counter() - t0 < limit:
        time.sleep(0.5)
        now = _cluster_cpu_seconds() or 0.0
        if now - before < 0.05:
            break
        before = now
    return time.perf_counter() - t0


def one_run(strategy: str, seconds: float, every: int) -> RunResult:
    settle()
    cfg = RunConfig(workload="cnn", strategy=strategy, engine="ray", shards=1, workers=4,
                    consistency="async", checkpoint_every=every, eval_every=10**6,
                    stop_at_target=False, max_iterations=10**7, wall_limit=seconds)
    cfg = for_strategy(cfg, strategy)  # no interval where nothing is saved
    return run_silent(cfg)


def rate(s: RunResult) -> float:
    """Updates applied a second of the run."""
    return s.updates_applied / s.wall_seconds


def quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


# -- the disk: checkpoint write vs a plain write of the same bytes --------------------
def _raw_write(folder: str, data: bytes, atomic: bool) -> float:
    """A new file, buffered writes, fsync: what the disk gives a plain writer.

    ``atomic``: as a crash-safe plain writer must, under a temp name, then renamed and
    the folder fsynced: two durable rounds, as a checkpoint's (its files and manifest
    fsynced together, then the rename). Without: one fsync, the disk's floor.
    """
    final = os.path.join(folder, f"raw-{uuid.uuid4().hex}")
    path = final + ".tmp" if atomic else final
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if atomic:
        os.rename(path, final)
        fsync_path(folder)
    took = time.perf_counter() - t0
    os.remove(final)  # not timed, as the checkpoint's prune is timed apart
    return took


def _raw_folder_write(folder: str, sizes: list[int]) -> float:
    """A crash-safe plain write of a folder of files of ``sizes`` bytes (a checkpoint's
    layout: one file per tensor group and the manifest), with none of our code: temp
    folder, the files written, fsynced together on the store's own fsync threads
    (durable.Syncing: a thread started per file cost more than the sync), the
    folder renamed, its parent fsynced. The cost of the layout itself, apart from ours."""
    final = os.path.join(folder, f"rawdir-{uuid.uuid4().hex}")
    tmp = final + ".tmp"
    blobs = [os.urandom(n) for n in sizes]
    t0 = time.perf_counter()
    os.mkdir(tmp)
    paths = []
    for i, blob in enumerate(blobs):
        paths.append(os.path.join(tmp, f"f{i}"))
        with open(paths[-1], "wb") as f:
            f.write(blob)
    Syncing(paths).wait()
    os.rename(tmp, final)
    fsync_path(folder)
    took = time.perf_counter() - t0
    shutil.rmtree(final)  # not timed, as for the other plain writes
    return took


def disk_comparison(scale: int, repeats: int) -> dict[str, float]:
    """Median seconds of a cnn-shard checkpoint (``scale`` times wider rows: same code,
    more bytes) against plain writes of as many bytes, all three interleaved; keep 3
    saves (each save from the 4th on prunes one)."""
    from trainthrough.ft.checkpoint import CheckpointStore, run_location
    from trainthrough.ft.decisions import CheckpointDecision
    from trainthrough.ft.shard_checkpoint import ShardCheckpoint
    from trainthrough.ps.layout import make_layout
    from trainthrough.ps.shard import Shard
    from trainthrough.workloads import make_workload

    w = make_workload("cnn", seed=0)
    x0 = w.init_params(torch.Generator().manual_seed(0))
    if scale > 1:
        x0 = {n: v.repeat(scale, *([1] * (v.dim() - 1))) for n, v in x0.items()}
    part = make_layout(x0, 1).split(x0)[0]
    shard = Shard(0, make_layout(x0, 1).shards[0], w.default_optimizer, part)
    t: dict[str, list[float]] = {"checkpoint": [], "written": [], "prune": [], "raw": [],
                                 "raw_atomic": [], "raw_folder": [], "crc32": []}
    with tempfile.TemporaryDirectory(prefix="tt-disk-") as folder:
        store = CheckpointStore(run_location(folder, "disk"), 3)
        saver = ShardCheckpoint(shard, part, store, reuse_snapshot=True)
        full = CheckpointDecision(asynchronous=True)
        nbytes = files = 0
        for step in range(1, repeats + 1):
            plan = saver.plan(full, step)
            assert plan is not None
            t0 = time.perf_counter()
            info = saver.write(plan)
            t["checkpoint"].append(time.perf_counter() - t0)
            t["written"].append(store.last_timing[0])
            t["prune"].append(store.last_timing[1])
            nbytes = info.nbytes
            data = os.urandom(nbytes)
            written = os.path.join(store.url, info.name)
            sizes = [os.path.getsize(os.path.join(written, f)) for f in os.listdir(written)]
            files = len(sizes)
            # Rotate which plain write goes first: none always follows the save.
            kinds = ["raw_atomic", "raw", "raw_folder"]
            for kind in kinds[step % 3:] + kinds[:step % 3]:
                t[kind].append(_raw_folder_write(folder, sizes) if kind == "raw_folder"
                               else _raw_write(folder, data, kind == "raw_atomic"))
            t0 = time.perf_counter()  # the checksum every checkpoint file needs, alone
            zlib.crc32(data)
            t["crc32"].append(time.perf_counter() - t0)
    return {"bytes": nbytes, "files": files,
            **{k: statistics.median(v) for k, v in t.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="training seconds per run")
    ap.add_argument("--repeats", type=int, default=5, help="measured repetitions (>= 1)")
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0, help="seeds the run order")
    ap.add_argument("--mid-mb", type=float, default=4.0,
                    help="also compare checkpoint and plain writes at about this size")
    ap.add_argument("--large-mb", type=float, default=32.0,
                    help="also compare checkpoint and plain writes at about this size")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="comma-separated subset to run (none is always run: ratios are "
                         "taken against it); the disk comparison runs only with "
                         "checkpoint-async, e.g. --strategies chain-sync,chain-async")
    ap.add_argument("--disk-only", action="store_true",
                    help="only the checkpoint write vs the plain writes (no Ray)")
    args = ap.parse_args()
    if args.disk_only:
        disk_report(disks(args.mid_mb, args.large_mb))
        return
    chosen = [x.strip() for x in args.strategies.split(",") if x.strip()]
    unknown = sorted(set(chosen) - set(STRATEGIES))
    if unknown or args.repeats < 1:
        ap.error(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}"
                 if unknown else "--repeats must be >= 1")
    strategies = tuple(x for x in STRATEGIES if x == "none" or x in chosen)
    rng = random.Random(args.seed)
    runs: dict[str, list[RunResult]] = {s: [] for s in strategies}
    ratios: dict[str, list[float]] = {s: [] for s in strategies}
    t_start = time.perf_counter()
    ensure_ray()
    try:
        # Warm-up, not counted: every strategy once, so that no measured run is the
        # first to need its actors (with only none warmed up, a chain's replicas were
        # created in repetition 1: in 4 runs of --strategies chain-sync, repetition 1
        # gave the lowest ratio every time).
        for s in strategies:
            one_run(s, args.seconds, args.checkpoint_every)
        for rep in range(args.repeats):
            order = list(strategies)
            rng.shuffle(order)
            this = {s: one_run(s, args.seconds, args.checkpoint_every) for s in order}
            for s in strategies:
                runs[s].append(this[s])
                ratios[s].append(rate(this[s]) / rate(this["none"]))
            print(f"repetition {rep + 1}/{args.repeats}: "
                  + ", ".join(f"{s} {rate(this[s]):.0f}" for s in order), flush=True)
    finally:
        shutdown_ray()
    disk_rows = (disks(args.mid_mb, args.large_mb) if "checkpoint-async" in strategies
                 else [])
    report(args, runs, ratios, disk_rows, time.perf_counter() - t_start)


def disks(*sizes_mb: float) -> list[tuple[str, dict[str, float]]]:
    """The disk comparison at the checkpoint's own size and at about each of ``sizes_mb``."""
    small = disk_comparison(1, 30)
    base_bytes = max(small["bytes"], 1)
    return [("checkpoint size", small)] + [
        (f"~{mb:g} MiB", disk_comparison(max(1, round(mb * 2**20 / base_bytes)), 9))
        for mb in sizes_mb]


def report(args: argparse.Namespace, runs: dict[str, list[RunResult]],
           ratios: dict[str, list[float]], disk_rows: list[tuple[str, dict[str, float]]],
           took: float) -> None:
    none_rates = [rate(r) for r in runs["none"]]
    noise = (max(none_rates) - min(none_rates)) / statistics.median(none_rates)
    print()
    print(f"failure-free throughput on Ray: cnn, 1 shard, 4 async workers, chains of 3, "
          f"{args.seconds:g} s per run, checkpoint every {args.checkpoint_every}; "
          f"1 warm-up each + {args.repeats} repetitions, order shuffled (seed {args.seed}); "
          f"{took:.0f} s in all")
    print(f"{'strategy':<18}{'updates/s':>10}{'vs none':>9}{'min-max':>14}{'IQR':>14}"
          f"{'overhead':>10}")
    suspect = []
    for s in runs:
        rs = ratios[s]
        med = statistics.median(rs)
        lo, hi = quartiles(rs)
        median = statistics.median(rate(r) for r in runs[s])
        print(f"{s:<18}{median:>10.1f}{med:>9.3f}{min(rs):>7.3f}-{max(rs):<6.3f}"
              f"{lo:>7.3f}-{hi:<6.3f}{100 * (1 - med):>9.1f}%")
        if s != "none" and med > 1 + max(0.03, noise / 2):
            suspect.append(s)
    print(f"none's own spread: {min(none_rates):.1f}-{max(none_rates):.1f} updates/s "
          f"({100 * noise:.0f}% of its median)")
    for s in suspect:
        print(f"WARNING: {s} beat none by more than the noise: the machine was busy; "
              f"rerun (more --repeats, quieter machine) before reading these ratios")
    if "checkpoint-async" in runs:
        ca = runs["checkpoint-async"]
        writes = sum(r.extras.get("checkpoint_writes", 0) for r in ca)
        skipped = sum(r.extras.get("checkpoint_skipped", 0) for r in ca)
        secs = sum(r.extras.get("checkpoint_write_seconds", 0.0) for r in ca)
        print(f"checkpoint-async in the runs: {writes} writes, {skipped} saves skipped "
              f"(a write still running), {1e3 * secs / max(writes, 1):.2f} ms per write "
              f"in the background")
        # Per repetition: does a bad ratio come with more of our own cost (time blocked,
        # seconds writing) or with the machine (none's rate in that repetition)?
        none_med = statistics.median(none_rates)
        for i, (r, ratio) in enumerate(zip(ca, ratios["checkpoint-async"])):
            wall = max(r.wall_seconds, 1e-9)
            writing = r.extras.get("checkpoint_write_seconds", 0.0)
            none_rate = rate(runs["none"][i])
            print(f"  repetition {i + 1}: ratio {ratio:.3f}; none {none_rate:.0f}/s "
                  f"({100 * (none_rate / none_med - 1):+.1f}% of its median); "
                  f"blocked {1e3 * r.checkpoint_blocked_seconds:.1f} ms and writing "
                  f"{1e3 * writing:.0f} ms ({100 * writing / wall:.1f}% of the run) in "
                  f"{r.extras.get('checkpoint_writes', 0)} writes")
    if disk_rows:
        disk_report(disk_rows)
    print("targets (median ratio vs none; the range shows whether it holds every time):")
    for s, text, ok in TARGETS:
        if s not in ratios:
            continue
        med = statistics.median(ratios[s])
        every = all(ok(r) for r in ratios[s])
        print(f"  {s:<17} {text:<15} {'PASS' if ok(med) else 'MISS'}  median {med:.3f} "
              f"({'every repetition' if every else 'not every repetition'})")


def disk_report(rows: list[tuple[str, dict[str, float]]]) -> None:
    print("disk (medians, interleaved): a checkpoint's durable write (temp folder, "
          "files, manifest, fsyncs, rename, folder fsync) vs a crash-safe plain write "
          "of as many bytes (temp file, fsync, rename, folder fsync: the same two "
          "durable rounds) and a bare write + fsync (one round)")
    for label, d in rows:
        mb = d["bytes"] / 2**20
        print(f"  {label} ({mb:.2f} MiB): checkpoint {1e3 * d['written']:.2f} ms "
              f"({mb / d['written']:.0f} MiB/s) + prune {1e3 * d['prune']:.2f} ms; plain "
              f"crash-safe {1e3 * d['raw_atomic']:.2f} ms ({mb / d['raw_atomic']:.0f} MiB/s), "
              f"bare {1e3 * d['raw']:.2f} ms: ratio {d['raw_atomic'] / d['written']:.2f} "
              f"(vs bare {d['raw'] / d['written']:.2f}; with prune "
              f"{d['raw_atomic'] / d['checkpoint']:.2f}); CRC-32 of the bytes alone "
              f"{1e3 * d['crc32']:.2f} ms")
        print(f"    the same {d['files']:.0f} files as a plain crash-safe folder write: "
              f"{1e3 * d['raw_folder']:.2f} ms, so the layout alone is at "
              f"{d['raw_atomic'] / d['raw_folder']:.2f} of one file and our code at "
              f"{d['raw_folder'] / d['written']:.2f} of the layout")
    for label, d in rows:
        r = d["raw_atomic"] / d["written"]
        print(f"  checkpoint write  >= {BANDWIDTH_TARGET:.0%} of raw ({label}) "
              f"{'PASS' if r >= BANDWIDTH_TARGET else 'MISS'}  {r:.2f}")


if __name__ == "__main__":
    main()
