"""Start-up of a Ray parameter-server run on a running cluster: cold vs warm actors.

Start-up is the time from the engine's start (Ray already up) to the first update
applied, as the run records it (``startup_seconds`` in its summary). The run is the
Training Through Failure suite's: cnn, 1 shard, 4 asynchronous workers,
checkpoint-async, 1.5 s long. Cold: no warm actor, so every actor is a new process
that imports torch; warm: the run's actors were kept by the run before it.

Default mode, runs in one driver (suites, benchmarks): warm runs take the actors the
previous run gave back (engines/ray/driver/pool.py). A warm-up pair runs first, not counted;
then cold and warm alternate (a warm run needs a run before it).

``--new-driver``: each run is a new ``trainthrough run --engine ray --ray-address ...
--keep-warm 300`` process on a cluster this script starts (``ray start --head`` on
127.0.0.1, its own session, ended at exit). Cold: ``trainthrough release`` first, so
the run starts every actor; warm: the run leases the actors the cold one before it
kept (engines/ray/driver/warm.py). Besides the engine's start-up, each run records the
whole wait from process start to the first update (``process_startup_seconds``) and
the part before Ray is joined (``driver_ready_seconds``: the interpreter, the
driver's own imports, config, joining); ``python -c 'import torch'`` and ``'import
ray'`` are timed in between, as the floor of that part.

Target: warm <= 3 s.

    python benchmarks/startup.py [--repeats 5]
    flock /tmp/tt-bench.lock python benchmarks/startup.py --new-driver --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainthrough.config import RunConfig
from trainthrough.engines.ray.driver.pool import POOL
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.lab.runner import run_silent


def one(cold: bool) -> float:
    if cold:
        POOL.clear()
    cfg = RunConfig(workload="cnn", strategy="checkpoint-async", engine="ray", shards=1,
                    workers=4, consistency="async", stop_at_target=False,
                    max_iterations=10**6, wall_limit=1.5)
    s = run_silent(cfg)
    return float(s.extras["startup_seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new-driver", action="store_true",
                    help="each run a new driver process on a running cluster")
    args = ap.parse_args()
    if args.new_driver:
        new_drivers(args.repeats)
        return
    t0 = time.perf_counter()
    ensure_ray()
    ray_up = time.perf_counter() - t0
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    try:
        one(True), one(False)  # warm-up: Ray's own first-use costs
        for _ in range(args.repeats):
            for kind in ("cold", "warm"):
                times[kind].append(one(kind == "cold"))
    finally:
        shutdown_ray()
    print(f"start-up of a Ray run (cnn, 1 shard, 4 async workers) on a running cluster "
          f"(ray.init took {ray_up:.1f} s, not counted), {args.repeats} repetitions")
    print(f"{'pool':<6}{'median s':>10}{'min s':>8}{'max s':>8}  each")
    for kind, v in times.items():
        each = " ".join(f"{x:.2f}" for x in v)
        print(f"{kind:<6}{statistics.median(v):>10.2f}{min(v):>8.2f}{max(v):>8.2f}  {each}")
    print(f"target: warm <= 3 s: {'met' if max(times['warm']) <= 3 else 'MISSED'}")


# -- new drivers on a running cluster ------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _timed(env: dict[str, str], *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, env=env, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t0


def _session(sid: int) -> list[int]:
    """Processes of session ``sid``: the head's, started with a session of its own."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                    out.append(int(d.name))
    return out


def new_drivers(repeats: int) -> None:
    tt = [sys.executable, "-m", "trainthrough.cli"]
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # Loopback listeners and a token only this script's processes know.
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    temp = tempfile.mkdtemp(prefix="ttsu-", dir="/tmp")  # short: Ray's socket paths
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
         "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false",
         f"--temp-dir={temp}", "--num-cpus=2", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    rows: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    imports: dict[str, list[float]] = {"torch": [], "ray": []}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.5)
        run = [*tt, "run", "--engine", "ray", "--ray-address", address, "--consistency",
               "async", "--workload", "cnn", "--shards", "1", "--workers", "4",
               "--strategy", "checkpoint-async", "--max-iterations", "1000000",
               "--target", "1.0", "--wall-limit", "1.5", "--keep-warm", "300", "--quiet",
               "--overwrite", "--out"]
        out = Path(temp) / "run"
        for rep in range(repeats + 1):  # the first pair warms Ray up: not counted
            for kind in ("cold", "warm"):
                if kind == "cold":
                    subprocess.run([*tt, "release", "--ray-address", address], env=env,
                                   check=True, capture_output=True, timeout=300)
                subprocess.run([*run, str(out)], env=env, check=True, capture_output=True,
                               timeout=600)
                s = json.loads((out / "summary.json").read_text())
                if rep:
                    rows[kind].append({k: float(s[k]) for k in (
                        "driver_ready_seconds", "startup_seconds", "process_startup_seconds")})
            if rep:
                imports["torch"].append(_timed(env, sys.executable, "-c", "import torch"))
                imports["ray"].append(_timed(env, sys.executable, "-c", "import ray"))
            print(f"repetition {rep}/{repeats}{' (warm-up)' if not rep else ''}", flush=True)
        subprocess.run([*tt, "release", "--ray-address", address], env=env,
                       capture_output=True, timeout=300)
    finally:
        head.send_signal(signal.SIGTERM)  # the head ends its own processes
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=60)
        for pid in _session(head.pid):  # and anything of its session left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
    print(f"new driver processes on a running cluster: cnn, 1 shard, 4 async workers, "
          f"{repeats} repetitions, cold (after `trainthrough release`) and warm (--keep-warm "
          f"actors of the run before) alternated; medians (min-max) in seconds")
    print(f"{'':<6}{'process start -> first update':>30}{'driver ready (imports, join)':>30}"
          f"{'engine start-up':>22}")
    for kind, v in rows.items():
        cells = []
        for k in ("process_startup_seconds", "driver_ready_seconds", "startup_seconds"):
            xs = [r[k] for r in v]
            cells.append(f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})")
        print(f"{kind:<6}{cells[0]:>30}{cells[1]:>30}{cells[2]:>22}")
    for k, v in imports.items():
        print(f"python -c 'import {k}': {statistics.median(v):.2f} s "
              f"({min(v):.2f}-{max(v):.2f})")
    worst = max(r["process_startup_seconds"] for r in rows["warm"])
    print(f"target: warm <= 3 s from process start: {'met' if worst <= 3 else 'MISSED'} "
          f"(worst {worst:.2f} s); engine start-up (Ray joined -> first update): "
          f"{'met' if max(r['startup_seconds'] for r in rows['warm']) <= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()
