"""The entry point of one rank process of the ``gloo`` engine.

Started by the controller (``python -m``, the spec as JSON on stdin) with a :data:`RankSpec`:
the resolved config, its slot and incarnation, the store's port, its failure
orders, and how it starts (``fresh``, ``restart`` from the checkpoint step the
controller chose, or ``join`` a running group). Then, attempt after attempt (protocol.py): wait for the plan,
form the group, recover as the plan says, train; on a collective error report and
wait for the next plan. A rank that is not in a plan, or is told to exit, ends.

Anything other than a failed collective is a bug: it is posted to the controller
with its traceback and the process exits with code 1, so no peer waits on it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from trainthrough.config import RunConfig
from trainthrough.dp.collective import PeerLost
from trainthrough.engines.gloo.group import Group
from trainthrough.engines.gloo.protocol import (
    PLAN_WAIT_SECONDS,
    RankSpec,
    Report,
    connect,
    has,
    post,
    wait_plan,
    write_report,
)
from trainthrough.engines.gloo.trainer import Trainer


def main(spec: RankSpec) -> None:
    """Run one rank process to its end (the multiprocessing target)."""
    # Ranks share a few cores: one intra-op thread each, and gloo on loopback only.
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = connect(spec["port"], timeout=PLAN_WAIT_SECONDS)
    try:
        _run(spec, store)
    except Exception:  # a bug: tell the controller rather than leave peers waiting
        post(store, {"type": "error", "slot": spec["slot"], "traceback": traceback.format_exc()})
        sys.exit(1)


def _run(spec: RankSpec, store: dist.Store) -> None:
    cfg = RunConfig.from_dict(spec["config"])
    slot, inc = spec["slot"], spec["inc"]
    tr = Trainer(cfg, slot, store, spec["orders"], spec["t0"], spec["checkpoint_url"],
                 joining=spec["mode"] == "join")
    if spec["mode"] == "restart":
        tr.restore(spec["restore"])
        tr.resumed = True  # its first commit ends the recovery
    tr.executed, tr.ctl_seen, tr.applied = spec["executed"], float(spec["ctl"]), spec["applied"]
    store.set(f"ready/{slot}/{inc}", "1")
    n = spec["attempt"]
    if spec["mode"] == "join":  # the controller says which attempt takes us in
        key = f"join/{slot}/{inc}"
        store.wait([key], timedelta(seconds=PLAN_WAIT_SECONDS))
        n = int(store.get(key))
    while True:
        plan = wait_plan(store, n)
        if plan.action == "exit" and plan.members[:1] == [slot]:
            tr.post_before()  # the first survivor: what the restart is measured against
        if slot not in plan.members or plan.action in ("exit", "stop"):
            break
        g = Group(store, n, plan.members, slot, cfg.cost.timeout_seconds)
        try:
            g.form()
            tr.recover(g, plan)
            outcome = tr.train(g)
        except PeerLost as e:
            write_report(store, n, Report(slot, "error", e.phase, e.buckets_done,
                                          e.applied, tr.executed, tr.logical, e.t, e.message))
            n += 1
            continue
        if outcome == "ctl" and not has(store, "stop"):
            g.close()
            write_report(store, n, Report(slot, "ctl", executed=tr.executed,
                                          logical=tr.logical))
            n += 1
            continue
        if g.rank == 0:
            tr.post_params(final=True)
        g.close()
        break
    post(store, {"type": "exit", **tr.finish()})


if __name__ == "__main__":  # started by procs.py: the spec arrives as JSON on stdin
    main(json.loads(sys.stdin.read()))
