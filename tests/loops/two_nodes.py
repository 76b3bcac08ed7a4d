"""Two Ray nodes on one machine, a user's loop on both, then one node lost (for the tests).

Usage: ``python two_nodes.py OUT`` (the test runs it inside ``unshare --net``, a network
namespace with loopback only). Ray refuses several nodes with its loopback-only
setting and then listens on every interface; in a private namespace "every interface"
is loopback, so nothing listens beyond this test. Steps:

1. ``ray start --head`` on 127.0.0.2 and ``ray start --address`` on 127.0.0.3, one CPU
   each, each in its own session (``--block``: the process group is ours to end);
2. ``ledger_loop.py`` (3 ranks, rollback) joins with ``--ray-address``;
3. once step 8 is committed, the second node's process group is SIGKILLed;
4. prints one JSON line: the loop's result and how long recovery took.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAY = str(Path(sys.executable).with_name("ray"))
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
       "RAY_worker_niceness": "0"}  # docs/running.md: actors at the others' priority
PORT = 6390


def node(ip: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([RAY, "start", "--block", f"--node-ip-address={ip}",
                             "--disable-usage-stats", "--num-cpus=1", *args], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def session_members(sid: int) -> list[int]:
    """Processes of session ``sid``: a node's, since its ``ray start`` got a session of
    its own. Ray gives each worker a process group of its own, so ending the node's
    process group would leave its actors running (measured)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                out.append(int(d.name))
    return out


def end(p: subprocess.Popen[bytes]) -> None:
    """Lose the node: SIGKILL every process of its session at once."""
    for pid in session_members(p.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    p.wait(timeout=60)


def wait_nodes(n: int, timeout: float = 150) -> None:
    code = ("import ray, time, sys\n"
            f"ray.init(address='127.0.0.2:{PORT}', _node_ip_address='127.0.0.2')\n"
            f"end = time.time() + {timeout}\n"
            f"while sum(x['Alive'] for x in ray.nodes()) < {n} and time.time() < end:\n"
            "    time.sleep(0.5)\n"
            f"sys.exit(sum(x['Alive'] for x in ray.nodes()) < {n})\n")
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True, capture_output=True,
                   timeout=timeout + 60)


def committed_steps(ledger: Path) -> int:
    steps = [int(line.split()[0]) for f in ledger.iterdir()
             for line in f.read_text().splitlines() if line]
    return max(steps, default=-1)


def main(out: Path) -> int:
    temp = tempfile.mkdtemp(prefix="tt2n-", dir="/tmp")  # short: Ray's socket paths
    ledger = out / "ledger"
    ledger.mkdir(parents=True)
    # Actors get the nodes' environment, not the driver's.
    ENV["TT_LEDGER"] = str(ledger)
    head = node("127.0.0.2", "--head", f"--port={PORT}", "--include-dashboard=false",
                f"--temp-dir={temp}")
    worker = None
    try:
        time.sleep(2)
        worker = node("127.0.0.3", f"--address=127.0.0.2:{PORT}")
        wait_nodes(2)
        run = subprocess.Popen([sys.executable, str(HERE / "ledger_loop.py"), "ray", "rollback",
                                "-", str(out / "run"), f"127.0.0.2:{PORT}"],
                               env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 240
        while time.time() < deadline and run.poll() is None and committed_steps(ledger) < 8:
            time.sleep(0.2)
        killed_at, step_at_kill = time.time(), committed_steps(ledger)
        end(worker)
        stdout, stderr = run.communicate(timeout=300)
        if run.returncode != 0:
            print(stderr[-3000:], file=sys.stderr)
            return 1
        result = json.loads(stdout.strip().splitlines()[-1])
        result["node_killed_after_step"] = step_at_kill
        result["seconds_after_kill"] = time.time() - killed_at
        print(json.dumps(result))
        return 0
    finally:
        if worker is not None:
            end(worker)
        end(head)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
