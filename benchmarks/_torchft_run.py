"""One torchft run for ``benchmarks/vs_torchft.py``: a lighthouse, N replica groups,
kills and restarts, and what the replicas logged.

The lighthouse is torchft's own ``torchft_lighthouse`` binary on 127.0.0.1 (a free
port), stopped by its PID at the end. Each replica group is one process
(``_torchft_replica.py``). The first start waits until every replica is up and
heartbeating before any trains (a ``go`` file), so the run starts with all N, as
trainthrough's group does; a killed replica is started again as soon as its death
is seen (polled every 10 ms, as trainthrough's controller polls its ranks) and heals
from a live peer. Only processes started here are ever signalled, by their PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TICK = 0.01
#: after the first replica finished, how long the others get to finish too (they commit
#: the last step together; only a replica still coming back is cut off)
GRACE = 2.0


@dataclass
class TorchftSettings:
    """What a torchft run is given (the benchmark states every one in its output)."""

    replicas: int
    steps: int
    kills: list[int]  #: replica 1 SIGKILLs itself at the allreduce of these steps
    heartbeat_ms: int  #: the lighthouse's --heartbeat_timeout_ms
    pg_timeout: float = 5.0  #: ProcessGroupGloo timeout (train_ddp.py's on CPU)
    batch: int = 32
    lr: float = 1e-3
    seed: int = 0
    ddp: bool = False  #: torchft's DistributedDataParallel instead of one allreduce a step
    deadline: float = 600.0
    script: str = "_torchft_replica.py"  #: the replica program (one per training scheme)
    extra: dict[str, Any] = field(default_factory=dict)  #: more of the replica's spec


@dataclass
class Replica:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    err: Path
    kills: list[int] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lighthouse_binary() -> str:
    exe = Path(sys.executable).with_name("torchft_lighthouse")
    found = str(exe) if exe.exists() else shutil.which("torchft_lighthouse")
    if not found:
        raise RuntimeError("torchft_lighthouse not found: pip install -e '.[bench]'")
    return found


def _start_lighthouse(heartbeat_ms: int, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """torchft's lighthouse on 127.0.0.1; min_replicas 1 (train_ddp.py's), so survivors
    go on without the lost replica."""
    for _ in range(5):  # the free port may be taken between the probe and the bind
        port = _free_port()
        err = (folder / "lighthouse.err").open("wb")
        p = subprocess.Popen([_lighthouse_binary(), "--min_replicas", "1",
                              "--bind", f"127.0.0.1:{port}",
                              "--heartbeat_timeout_ms", str(heartbeat_ms)],
                             stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                             env={**os.environ, "RUST_LOG": "warn"})
        err.close()
        end = time.time() + 15
        while time.time() < end and p.poll() is None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return p, f"http://127.0.0.1:{port}"
            time.sleep(0.05)
        _stop(p)
    raise RuntimeError(f"torchft_lighthouse did not start: {(folder / 'lighthouse.err').read_text()[-500:]}")


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)  # our own child, by its PID
    p.wait(timeout=10)


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by the SIGKILL
            out.append(json.loads(line))
    return out


def run(s: TorchftSettings, folder: Path) -> list[dict[str, Any]]:
    """Train to ``s.steps`` committed steps; returns every replica's log records, each
    with its ``replica`` index.

    Raises:
        RuntimeError: a replica failed other than by the kills ordered, or the run
            missed its deadline (with the replica's last lines of stderr).
    """
    folder.mkdir(parents=True, exist_ok=True)
    go = folder / "go"
    lighthouse, address = _start_lighthouse(s.heartbeat_ms, folder)
    live: dict[int, Replica] = {}
    logs: list[tuple[int, Path]] = []
    starts = 0

    def start(i: int, kills: list[int]) -> None:
        nonlocal starts
        starts += 1
        log, err = folder / f"r{i}-{starts}.jsonl", folder / f"r{i}-{starts}.err"
        spec = {"replica": i, "replicas": s.replicas, "lighthouse": address,
                "steps": s.steps, "kills": kills, "log": str(log), "go": str(go),
                "batch": s.batch, "lr": s.lr, "seed": s.seed,
                "pg_timeout": s.pg_timeout, "ddp": s.ddp, **s.extra}
        with err.open("wb") as e:
            p = subprocess.Popen([sys.executable, str(HERE / s.script),
                                  json.dumps(spec)], stdout=subprocess.DEVNULL, stderr=e,
                                 stdin=subprocess.DEVNULL,
                                 env={**os.environ, "RUST_LOG": "warn"})
        live[i] = Replica(i, p, log, err, kills)
        logs.append((i, log))

    try:
        for i in range(s.replicas):
            start(i, list(s.kills) if i == 1 else [])
        end = time.time() + s.deadline
        while not all(any("ready" in r for r in _read(rep.log)) for rep in live.values()):
            _check(live, end)
            time.sleep(TICK)
        go.touch()
        done: set[int] = set()
        over = 0.0  # when the first replica finished: the run is over
        while not over or (len(done) < len(live) and time.time() - over < GRACE):
            for i, rep in list(live.items()):
                rc = rep.proc.poll()
                if rc is None or i in done:
                    continue
                if rc == 0 or (rc == -signal.SIGKILL and over):
                    done.add(i)  # a kill after the end is not restarted
                    over = over or time.time()
                elif rc == -signal.SIGKILL and rep.kills:
                    start(i, rep.kills[1:])  # that kill is spent
                else:
                    raise RuntimeError(f"torchft replica {i} exited with {rc}:\n"
                                       f"{rep.err.read_text()[-2000:]}")
            _check(live, end)
            time.sleep(TICK)
    finally:
        for rep in live.values():
            _stop(rep.proc)
        _stop(lighthouse)
    return [{"replica": i, **r} for i, log in logs for r in _read(log)]


def _check(live: dict[int, Replica], end: float) -> None:
    if time.time() > end:
        tails = "\n".join(f"replica {i}: {r.err.read_text()[-800:]}" for i, r in live.items())
        raise RuntimeError(f"torchft run missed its deadline\n{tails}")
    for i, rep in live.items():
        if rep.proc.poll() not in (None, 0, -signal.SIGKILL):
            raise RuntimeError(f"torchft replica {i} exited with {rep.proc.returncode}:\n"
                               f"{rep.err.read_text()[-2000:]}")
