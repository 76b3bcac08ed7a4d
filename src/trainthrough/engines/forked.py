"""What a process forked from a warm server takes from the one it works for.

Two servers fork workers that imported torch once: the gloo zygote (a rank per
request, engines/gloo/zygote_main.py) and the fork server of suites' and checks' job
pools (lab/jobs.py). A fork carries the *server's* working folder, environment and
random state; the worker must act as a fresh process started by its caller would.
"""

from __future__ import annotations

import os
import sys


def take_place(cwd: str, env: dict[str, str]) -> None:
    """The caller's working folder and environment, and the fresh random state a new
    interpreter would have (Python's ``random`` reseeds itself after a fork; numpy's
    global generator does not)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
