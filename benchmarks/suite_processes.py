"""Which processes the test suite's CPU goes to: Ray actors, daemons, ranks, CLI runs.

``suite_cpu.py`` charges each test the machine's CPU while it runs alone; this reads
the kernel's process accounting of a whole ``make test`` (every process that ended,
its CPU, parent and start), so it sees what no test's own process does: how many Ray
actor processes the suite starts, what each costs, and which Ray cluster they ran on (its start counted from
``make``'s).
As root (the ``acct`` package provides ``accton`` and ``dump-acct``):

    apt-get install acct
    touch /tmp/suite.pacct && accton /tmp/suite.pacct
    make test; accton off
    .venv/bin/python benchmarks/suite_processes.py /tmp/suite.pacct

It prints the CPU seconds by command name (a Ray actor's is ``ray::<Class>``), then
each Ray cluster (by its raylet): its actors' CPU and count by class, when it started
and what started it.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime


@dataclass
class Proc:
    comm: str
    cpu: float  #: user + system seconds
    pid: int
    ppid: int
    start: float  #: epoch seconds (whole seconds: the accounting's resolution)


def read(path: str) -> list[Proc]:
    """The ended processes of ``path`` (a v3 accounting file, through ``dump-acct``)."""
    out = subprocess.run(["dump-acct", path], capture_output=True, text=True, check=True)
    procs = []
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15:
            continue
        start = datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y").timestamp()
        procs.append(Proc(f[0], (float(f[2]) + float(f[3])) / 100, int(f[9]), int(f[10]),
                          start))
    return procs


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: suite_processes.py PACCT_FILE", file=sys.stderr)
        return 2
    try:
        procs = read(argv[0])
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"suite_processes: cannot read {argv[0]}: {e}", file=sys.stderr)
        return 2
    if not procs:
        print(f"suite_processes: {argv[0]} holds no process", file=sys.stderr)
        return 2
    total = sum(p.cpu for p in procs)
    print(f"{len(procs)} processes, {total:.0f} CPU s")
    by_comm: dict[str, list[Proc]] = collections.defaultdict(list)
    for p in procs:
        by_comm[p.comm].append(p)
    print(f"\n{'command':<18} {'n':>5} {'CPU s':>8} {'share':>6} {'per process':>12}")
    for comm, ps in sorted(by_comm.items(), key=lambda kv: -sum(p.cpu for p in kv[1]))[:20]:
        cpu = sum(p.cpu for p in ps)
        print(f"{comm:<18} {len(ps):>5} {cpu:>8.1f} {cpu / total:>6.1%} {cpu / len(ps):>12.2f}")
    pids = {p.pid: p for p in procs}
    # From the suite's start (make's), not from a process that began long before it.
    t0 = min((p.start for p in procs if p.comm == "make"),
             default=min(p.start for p in procs))
    clusters: dict[int, list[Proc]] = collections.defaultdict(list)
    for p in procs:
        parent = pids.get(p.ppid)
        if parent is not None and parent.comm == "raylet" and p.comm.startswith("ray::"):
            clusters[parent.pid].append(p)
    print("\nRay clusters (by raylet), their actor processes:")
    for raylet, ps in sorted(clusters.items(), key=lambda kv: -sum(p.cpu for p in kv[1])):
        node, starter = pids[raylet], pids.get(pids[raylet].ppid)
        kinds = collections.Counter(p.comm for p in ps)
        print(f"  {sum(p.cpu for p in ps):7.1f} CPU s  {len(ps):3d} actors  from "
              f"+{node.start - t0:4.0f} s, started by {starter.comm if starter else '?'}: "
              + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
