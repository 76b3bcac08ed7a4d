"""Data parallel across two "hosts" (network namespaces), then one host lost or cut off
(for the tests).

Usage: ``python two_hosts.py OUT [kill|cut|cut-drop]`` as root. Two namespaces joined by a veth pair
(tests/netns.py: 10.254.0.1 and 10.254.0.2, no other route):

1. a Ray head in ``a`` and a Ray worker node in ``b`` (one CPU each, token auth);
2. the driver, in ``a``, runs ``ledger_loop.py``'s loop on 3 ranks (rollback) with
   ``ray_address`` the head's: ranks land on both hosts;
3. once step 6 is committed, every process of ``b`` is SIGKILLed at once (the host is
   lost) and a new Ray node is started in ``b``: the survivors roll back, and the
   replacement rank is placed on the new node and joins with a peer's state;
   With ``cut`` instead, the pair is cut for ``CUT_SECONDS`` (tests/netns.py, a
   partition): ``b``'s processes live on, out of reach, and the survivors roll back
   once their collective times out. Ray keeps ``b``'s node (its health check waits
   longer than the cut), and the replacements go there once healed. With ``cut-drop``,
   Ray drops ``b``'s node during the cut (it reports its actors dead while they run on)
   and a new node is started in ``b`` after the heal, as a cluster's manager replaces a
   node it lost;
4. prints one JSON line: the loop's result, the nodes, and every TCP listener seen in
   either namespace while the ranks trained (address -> process name).

``python two_hosts.py --driver OUT ADDRESS`` is step 2 (run inside ``a``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
from tests.netns import Hosts  # noqa: E402

RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6390
#: Ray's worker processes (the driver's and each actor's) serve Ray's gRPC in this range.
WORKER_PORTS = (10002, 19999)
KILL_AFTER_STEP = 6
#: How long a cut keeps the hosts apart: past the collective timeout (5 s), so both
#: sides find the other gone while both live; within Ray's node timeout (2 x 20 s,
#: below) with ``cut``, past it (2 x 0.5 s) with ``cut-drop``.
CUT_SECONDS = 8.0
# A replacement may join this long after the loss: at once, as soon as it is up. Where it
# goes is the product's to get right, not a delay's (dp.RayDataParallel.placement): its
# rank went with its host, so it waits for a node that can take it, the one started in
# that host's place. Steps take STEP_SLEEP so that the run outlasts the new node's start.
RECOVERY_DELAY = 0.5
STEP_SLEEP = 0.35  # 64 steps: 22 s, the join (the new node's start + an actor) inside
# Ray notices a lost node from missed health checks: every 0.5 s, 2 missed (default 3 s x 5).
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0",
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
       "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "2",
       "RAY_health_check_initial_delay_ms": "0", "TT_STEP_SLEEP": str(STEP_SLEEP),
       # A check unanswered (a cut, not a kill, which refuses at once) fails after
       # this: Ray drops a node only after 2 x 20 s of silence, well past CUT_SECONDS,
       # so through a cut only the run's own mechanisms act (its collective timeout).
       "RAY_health_check_timeout_ms": "20000",
       # As docs/running.md advises for a cluster's nodes: actors at the priority of the
       # rest, not Ray's nice 15 (beside two busy loops a rank took 100 s to import torch).
       "RAY_worker_niceness": "0",
       "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}


#: The driver's: what a user's shell has (Ray's cluster switch is the nodes' business, set
#: by whoever runs ``ray start``; the driver must work without it).
DRIVER_ENV = {k: v for k, v in ENV.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}


def node(hosts: Hosts, side: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(hosts.cmd(side, [RAY, "start", "--block",
                                             f"--node-ip-address={hosts.ip[side]}",
                                             "--disable-usage-stats", "--num-cpus=1",
                                             f"--min-worker-port={WORKER_PORTS[0]}",
                                             f"--max-worker-port={WORKER_PORTS[1]}", *args]),
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def alive_nodes(hosts: Hosts, n: int, gone: str = "",
                timeout: float = 60) -> list[dict[str, object]]:
    """Wait until ``n`` nodes other than ``gone`` (an id) are alive; every node (id,
    address, alive)."""
    code = ("import ray, time, json\n"
            f"ray.init(address='{hosts.ip['a']}:{PORT}', _node_ip_address='{hosts.ip['a']}',"
            " log_to_driver=False)\n"
            f"end = time.time() + {timeout}\n"
            f"while sum(x['Alive'] and x['NodeID'] != '{gone}' for x in ray.nodes()) < {n}"
            " and time.time() < end:\n"
            "    time.sleep(0.2)\n"
            "print('NODES', json.dumps([{'id': x['NodeID'], 'ip': x['NodeManagerAddress'],"
            " 'alive': x['Alive']} for x in ray.nodes()]))\n")
    out = subprocess.run(hosts.cmd("a", [sys.executable, "-c", code]), env=ENV, check=True,
                         capture_output=True, text=True, timeout=timeout + 60)
    line = [x for x in out.stdout.splitlines() if x.startswith("NODES ")]
    if not line:
        raise RuntimeError(f"no node list: {out.stdout[-2000:]} {out.stderr[-2000:]}")
    nodes: list[dict[str, object]] = json.loads(line[-1][6:])
    if sum(bool(x["alive"]) and x["id"] != gone for x in nodes) < n:
        raise RuntimeError(f"fewer than {n} Ray nodes came up: {nodes}")
    return nodes


def committed_steps(ledger: Path) -> int:
    steps = [int(line.split()[0]) for f in ledger.iterdir()
             for line in f.read_text().splitlines() if line]
    return max(steps, default=-1)


def first_step_after(ledger: Path, old: set[str], since: float, timeout: float) -> float | None:
    """Seconds from ``since`` until a process not in ``old`` (a ledger file name) wrote
    its first step: the replacement's first step."""
    end = time.time() + timeout
    while time.time() < end:
        if any(f.name not in old and f.stat().st_size > 0 for f in ledger.iterdir()):
            return time.time() - since
        time.sleep(0.05)
    return None


def driver(out: Path, address: str) -> None:
    from tests.loops.ledger_loop import train
    from trainthrough.loop import launch

    r = launch(train, ranks=3, engine="ray", strategy="rollback", out=out, ray_address=address,
               recovery_delay=RECOVERY_DELAY, timeout=5.0, progress=False)
    keys = ("failures", "recoveries", "rank_nodes", "ranks_final", "ranks_joined",
            "replicas_identical", "detection_seconds", "reform_seconds", "store_address",
            "writes_refused")
    summary = r.summary.to_dict()  # as summary.json has it
    print(json.dumps({"returned": r.returned, "committed": r.committed,
                      "summary": {k: summary.get(k) for k in keys}}))


def _running(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists()]


def _cut(hosts: Hosts, ledger: Path) -> dict[str, Any]:
    """Cut the hosts apart for :data:`CUT_SECONDS`, then heal; the ranks that were in
    ``b`` (pids, their ledger files' names) and which of them lived through the cut."""
    ranks = {int(f.stem) for f in ledger.iterdir()}
    cut_off = hosts.pids("b")
    in_b = sorted(ranks & set(cut_off))  # the ranks of b: their ledger files' names
    with hosts.partition():
        started = time.time()
        time.sleep(CUT_SECONDS)  # the cut's length is the scenario, not a wait for order
        alive = _running(in_b)  # b's ranks live through it: nothing could end them
    return {"cut_off_ranks": in_b, "alive_while_cut": alive,
            "cut_seconds": round(time.time() - started, 2)}


def main(out: Path, how: str = "kill") -> int:
    temp = tempfile.mkdtemp(prefix="tt2h-", dir="/tmp")  # short: Ray's socket paths
    ledger = out / "ledger"
    ledger.mkdir(parents=True)
    ENV["TT_LEDGER"] = str(ledger)  # actors get their node's environment
    hosts = Hosts().create()
    seen: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            for side in "ab":
                for addr, (_, comm) in hosts.listeners(side).items():
                    seen[side][addr] = comm
            time.sleep(0.3)

    t0 = time.time()
    try:
        node(hosts, "a", "--head", f"--port={PORT}", "--include-dashboard=false",
             f"--temp-dir={temp}")
        node(hosts, "b", f"--address={hosts.ip['a']}:{PORT}")
        before = alive_nodes(hosts, 2)
        up = time.time() - t0
        run = subprocess.Popen(hosts.cmd("a", [sys.executable, __file__, "--driver", str(out / "run"),
                                               f"{hosts.ip['a']}:{PORT}"]),
                               env=DRIVER_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        deadline = time.time() + 120
        while (time.time() < deadline and run.poll() is None
               and committed_steps(ledger) < KILL_AFTER_STEP):
            time.sleep(0.1)
        step_at_kill, killed_at = committed_steps(ledger), time.time()
        if how.startswith("cut"):
            extra = _cut(hosts, ledger)
            killed, first = 0, [None]
            if how == "cut":
                after = alive_nodes(hosts, 2)  # the same two: Ray kept b's node
            else:  # Ray dropped b's node: a new one in its place, as a cluster's manager
                node(hosts, "b", f"--address={hosts.ip['a']}:{PORT}")
                lost = next(str(x["id"]) for x in before if x["ip"] == hosts.ip["b"])
                after = alive_nodes(hosts, 2, gone=lost)
            rejoined = time.time() - killed_at
        else:
            extra = {}
            killed = hosts.kill_all("b")
            old = {f.name for f in ledger.iterdir()}
            node_started = time.time()
            node(hosts, "b", f"--address={hosts.ip['a']}:{PORT}")  # a new node on that host
            first = []
            watch = threading.Thread(target=lambda: first.append(
                first_step_after(ledger, old, node_started, 150)), daemon=True)
            watch.start()
            lost = next(str(x["id"]) for x in before if x["ip"] == hosts.ip["b"])
            after = alive_nodes(hosts, 2, gone=lost)
            rejoined = time.time() - killed_at
        stdout, stderr = run.communicate(timeout=180)
        sampling.set()
        sampler.join()
        if how.startswith("cut"):  # the cut-off ranks' processes: ended with the run, if not before
            end = time.time() + 30  # (Ray ends a finished job's actors: soon, not at once)
            while _running(extra["cut_off_ranks"]) and time.time() < end:
                time.sleep(0.2)
            extra["running_at_the_end"] = _running(extra["cut_off_ranks"])
        if run.returncode != 0:
            print(stderr[-3000:], file=sys.stderr)
            return 1
        result = json.loads(stdout.strip().splitlines()[-1])
        result.update(node_killed_after_step=step_at_kill, processes_killed=killed,
                      cluster_up_seconds=up, new_node_up_seconds=rejoined,
                      node_start_to_first_step=first[0] if first else None,
                      placed=[json.loads(x) for x in (out / "run" / "events.jsonl")
                              .read_text().splitlines() if '"rank-placed"' in x],
                      nodes_before=before, nodes_after=after, listeners=seen,
                      wall_seconds=time.time() - t0, **extra)
        print(json.dumps(result))
        return 0
    finally:
        sampling.set()
        hosts.close()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "--driver":
        driver(Path(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    if sys.argv[2:3] == ["cut-drop"]:  # Ray drops a node after 2 x 0.5 s of silence
        ENV["RAY_health_check_timeout_ms"] = "500"
    sys.exit(main(Path(sys.argv[1]), *sys.argv[2:3]))
