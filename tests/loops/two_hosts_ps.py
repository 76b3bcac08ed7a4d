"""A parameter-server chain across two "hosts" (network namespaces), its head's host lost
or cut off.

Usage: ``python two_hosts_ps.py OUT [kill|cut]`` as root. The namespaces, Ray nodes and driver as in
two_hosts.py; the run: mlr, chain-sync, 1 shard, a chain of 2 (its head on the worker
node's host ``b``: on a cluster the driver joined, chains go round the nodes, the
driver's last), 2 workers, asynchronous, to a fixed number of iterations. Once it has
evaluated iteration ``KILL_AT``, every process of ``b`` is SIGKILLed; the replica in ``a``
takes over. The run is bounded by iterations, not by its wall clock: on a loaded machine
the workers may take most of a short wall limit to start, and the kill must land while
the run still has most of its work ahead. Prints one JSON line: the run's summary, the
iteration evaluated last before the kill, whether the run was still going then, what was
killed (process names), Ray processes of ``a`` that ended within 2 s of the kill (none
should), and the listeners seen on each host.

With ``cut``, the chains' coordinator is ZooKeeper (a server the driver starts in ``a``,
on ``a``'s address) and, instead of the kill, the hosts are cut apart for
``CUT_SECONDS`` (tests/netns.py), then healed: the head, in ``b``, lives on, out of
reach of ZooKeeper, the driver and its tail. Every replica keeps an audit of what it
acknowledged (engines/ray/chain/audit.py) in ``OUT/audit``, which the test reads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
from tests.loops.two_hosts import DRIVER_ENV, ENV, PORT, alive_nodes, node  # noqa: E402
from tests.netns import Hosts  # noqa: E402

KILL_AT = 50  # b is lost once this iteration is evaluated ...
ITERATIONS = 300  # ... of these (110 a second on this machine idle, 5 under a heavy load)
#: With ``cut``: the run goes on well past the heal (the failover comes 4-7 s into the
#: cut, and one worker alone then runs this many at the rate above).
CUT_ITERATIONS = 1500
WALL_LIMIT = 200.0  # a safety net only: the test's own timeout is 280 s
#: The cut: past the replicas' ZooKeeper session (2 s) and the driver's ping (2 s), so
#: the head's session expires and its tail takes over while the head still runs.
CUT_SECONDS = 8.0


def driver(out: Path, address: str, how: str) -> None:
    import contextlib

    from trainthrough.config import RunConfig
    from trainthrough.coord.zkserver import ZooKeeperServer
    from trainthrough.lab import runner

    with contextlib.ExitStack() as stack:
        zk = {}
        if how == "cut":  # on a's address: b's replicas must reach it (until the cut)
            server = stack.enter_context(ZooKeeperServer(address=address.split(":")[0]))
            zk = {"coordinator": "zookeeper", "zookeeper_hosts": server.hosts}
        cfg = RunConfig(workload="mlr", engine="ray", consistency="async", shards=1,
                        workers=2, strategy="chain-sync", replicas=2, ray_address=address,
                        wall_limit=WALL_LIMIT, recovery_delay=1.0,
                        max_iterations=CUT_ITERATIONS if how == "cut" else ITERATIONS,
                        stop_at_target=False, **zk)
        s = runner.run(cfg, out).to_dict()  # as summary.json has it
    print(json.dumps({k: s.get(k) for k in
                      ("failures", "recoveries", "acknowledged_lost", "updates_lost",
                       "iterations", "updates_applied")}))


def _evaluated(metrics: Path) -> int:
    """The last iteration the run evaluated (-1 before the first)."""
    last = -1
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                last = max(last, int(json.loads(line)["iteration"]))
            except (ValueError, KeyError):
                continue  # a line being written
    return last


def _names(hosts: Hosts, side: str) -> dict[int, str]:
    out = {}
    for pid in hosts.pids(side):
        try:
            out[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
    return out


def main(out: Path, how: str = "kill") -> int:
    temp = tempfile.mkdtemp(prefix="tt2p-", dir="/tmp")
    audit = out / "audit"
    audit.mkdir(parents=True)
    ENV["TRAINTHROUGH_CHAIN_AUDIT"] = str(audit)  # the replicas get their node's
    hosts = Hosts().create()
    seen: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for side in "ab":
                for addr, (_, comm) in hosts.listeners(side).items():
                    seen[side][addr] = comm
            time.sleep(0.3)

    try:
        node(hosts, "a", "--head", f"--port={PORT}", "--include-dashboard=false",
             f"--temp-dir={temp}")
        node(hosts, "b", f"--address={hosts.ip['a']}:{PORT}")
        alive_nodes(hosts, 2)
        run = subprocess.Popen(hosts.cmd("a", [sys.executable, __file__, "--driver",
                                               str(out / "run"), f"{hosts.ip['a']}:{PORT}",
                                               how]),
                               env=DRIVER_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        threading.Thread(target=sample, daemon=True).start()
        deadline = time.time() + 120
        metrics = out / "run" / "metrics.jsonl"
        while time.time() < deadline and run.poll() is None and _evaluated(metrics) < KILL_AT:
            time.sleep(0.1)
        at_kill, running = _evaluated(metrics), run.poll() is None
        killed = sorted(set(_names(hosts, "b").values()))
        in_a = {p: n for p, n in _names(hosts, "a").items() if n.startswith("ray::")}
        cut: dict[str, object] = {}
        if how == "cut":
            with hosts.partition():
                started = time.time()
                time.sleep(CUT_SECONDS)  # the cut's length is the scenario
                cut["alive_in_b_while_cut"] = sorted(set(_names(hosts, "b").values()))
            cut.update(cut_from=started, healed_at=time.time())
        else:
            hosts.kill_all("b")
            time.sleep(2)
        now_a = _names(hosts, "a")
        gone_in_a = sorted(n for p, n in in_a.items() if p not in now_a)
        stdout, stderr = run.communicate(timeout=180)
        done.set()
        if run.returncode != 0:
            print(stderr[-3000:], file=sys.stderr)
            return 1
        result = json.loads(stdout.strip().splitlines()[-1])
        result.update(evaluated_at_kill=at_kill, running_at_kill=running, killed=killed,
                      gone_in_a=gone_in_a, listeners=seen, audit=str(audit), **cut)
        print(json.dumps(result))
        return 0
    finally:
        done.set()
        hosts.close()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "--driver":
        driver(Path(sys.argv[2]), sys.argv[3], sys.argv[4])
        sys.exit(0)
    sys.exit(main(Path(sys.argv[1]), *sys.argv[2:3]))
