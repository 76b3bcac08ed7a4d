"""The partition tests in their long form: every variant of the two-host cut.

``tests/test_two_hosts.py`` cuts two network namespaces apart during a data-parallel run
and a chain-replicated parameter server. The suite runs one variant of the data-parallel
cut (Ray keeps the cut-off node); this runs them all, including the one where Ray drops
the node and reports its ranks dead while they run on (about 70 s each on a 2-core
machine). Needs root (network namespaces), as the tests do.

    .venv/bin/python benchmarks/partitions.py [--repeat N]

Exits with pytest's status: 0 when every run of every variant passed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1, help="runs of each variant (default 1)")
    args = p.parse_args()
    if args.repeat < 1:
        print("partitions.py: --repeat must be at least 1", file=sys.stderr)
        return 2
    env = {**os.environ, "TT_PARTITIONS_LONG": "1"}
    worst = 0
    for i in range(args.repeat):
        print(f"round {i + 1} of {args.repeat}", flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "tests/test_two_hosts.py", "-k", "cut"], cwd=ROOT, env=env)
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main())
