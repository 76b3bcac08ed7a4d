"""Where the test suite's CPU goes: each test's share of the whole machine's CPU time.

The full suite keeps both cores busy from its first test to its last (vmstat: 0% idle),
so its wall time is its CPU time over the cores, and what shortens it is less CPU, not
fewer waits. A test's own process does not show that: its gloo ranks, Ray's daemons and
actors, a CLI subprocess all burn CPU elsewhere. This plugin reads the machine-wide busy
time from ``/proc/stat`` before and after each test, so run the suite one test at a time
and nothing else beside it:

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -n 0 -p suite_cpu -m slow
    .venv/bin/python benchmarks/suite_cpu.py            # the table, by file and by test

``SUITE_CPU_OUT`` names the JSON-lines file (default ``runs/suite_cpu.jsonl``; appended
to, one line a test: id, CPU seconds, wall seconds).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

OUT = Path(os.environ.get("SUITE_CPU_OUT", "runs/suite_cpu.jsonl"))


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (user, nice, system, irq,
    softirq: everything but idle, iowait and steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    cpu, wall = busy_seconds(), time.monotonic()
    yield
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("a") as f:
        f.write(json.dumps({"id": item.nodeid, "cpu": round(busy_seconds() - cpu, 2),
                            "wall": round(time.monotonic() - wall, 2)}) + "\n")


def report(path: Path, top: int = 30) -> str:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = files[r["id"].split("::")[0]]
        f[0] += r["cpu"]
        f[1] += r["wall"]
        f[2] += 1
    total = sum(r["cpu"] for r in rows)
    out = [f"{len(rows)} tests: {total:.0f} CPU seconds, {sum(r['wall'] for r in rows):.0f} "
           "wall seconds (one at a time)", "", "CPU s   wall s  tests  file"]
    out += [f"{c:6.0f}  {w:6.0f}  {n:5d}  {name}"
            for name, (c, w, n) in sorted(files.items(), key=lambda x: -x[1][0])[:top]]
    out += ["", "CPU s   wall s  test"]
    out += [f"{r['cpu']:6.1f}  {r['wall']:6.1f}  {r['id']}"
            for r in sorted(rows, key=lambda r: -r["cpu"])[:top]]
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    if not path.is_file():
        print(f"suite_cpu: no {path}: run the suite with this plugin first (see the "
              "module docstring)", file=sys.stderr)
        sys.exit(2)
    print(report(path))
