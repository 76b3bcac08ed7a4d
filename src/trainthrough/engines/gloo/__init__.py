"""The ``gloo`` engine (``--engine dist`` is its older alias): data-parallel ranks as OS
processes on a torch.distributed gloo group (127.0.0.1, or ``--bind-address``), started and supervised by a
controller that owns the store. This module declares what the engine runs; importing
it does not import torch.distributed.
"""

from trainthrough.engines.capabilities import caps

DESCRIPTION = ("data-parallel ranks as OS processes on a torch.distributed gloo group "
               "(127.0.0.1); failures are real SIGKILL/SIGSTOP/SIGCONT (alias: dist)")
ENGINE = "trainthrough.engines.gloo.controller:GlooEngine"
CAPABILITIES = {
    # Checkpoints are written by rank 0: before its next step (sync) or on a
    # background thread from a host copy (async).
    # --resume: every rank starts from the run's newest checkpoint, as a restart does.
    "dp": caps(resume=True, consistency=("bsp",), checkpoint=("none", "full"),
               persist=("sync", "async"),
               recovery=("rollback-all", "mini-batch-rollback", "lossy-forward", "drop-local"),
               replication=("none",), outage=("wait",), targets=("rank",),
               triggers=("iter", "time", "mtbf"),
               phases=("", "forward", "backward", "allreduce", "update", "inner", "outer"),
               # pause: SIGSTOP, then SIGCONT by the controller's pinned handle;
               # slow: the rank sleeps (faults.py); preempt: SIGTERM (the notice), then
               # SIGKILL; the rank drains (notice.py)
               modes=("crash", "hang", "pause", "slow", "preempt"),
               options=("ranks", "elastic", "allreduce_buckets", "micro_batches", "replace",
                        "device", "collective",
                        "recovery_delay", "wall_limit", "bind_address", "liveness_timeout",
                        "max_restarts", "straggler_deadline"),
               sync=("every-step", "localsgd", "diloco", "streaming-diloco")),
}
