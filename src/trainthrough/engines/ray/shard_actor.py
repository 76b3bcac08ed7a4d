"""A parameter-server shard (or one replica of its chain) hosted in a Ray actor.

The actor is a thin host around :class:`trainthrough.ps.shard.Shard`: the same
update, dedup and state code as every engine. What it adds is process-level:
its pid (failures are real SIGKILLs), a ``watch`` call that only returns when the
process dies (Ray's death notification, without polling), and chain replication:
forwarding each applied push to a successor, synchronously (the push is
acknowledged after the tail applied it) or asynchronously (a background thread
forwards in order, at most ``max_lag`` pushes behind).

Threaded actor: ``watch`` parks one thread for good; pushes from several workers run
on the others and a lock orders them, so every replica applies pushes in one order.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

import ray
import torch

from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.shard_checkpoint import Planned, ShardCheckpoint
from trainthrough.ps.layout import RowBlock
from trainthrough.ps.shard import Shard, clone_state
from trainthrough.workloads.base import OptimizerSpec

Tensors = dict[str, torch.Tensor]


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=8)  # type: ignore[call-overload]
class ShardActor:
    """One shard replica. ``mode``: ``none`` (no successor), ``sync`` or ``async``."""

    def __init__(self, shard_id: int, blocks: tuple[RowBlock, ...], spec: OptimizerSpec,
                 values: Tensors, name: str, max_lag: int = 64) -> None:
        torch.set_num_threads(1)
        self._dead = threading.Event()  # released (set) only when a run gives it back
        self.reset(shard_id, blocks, spec, values, name, max_lag)

    def reset(self, shard_id: int, blocks: tuple[RowBlock, ...], spec: OptimizerSpec,
              values: Tensors, name: str, max_lag: int = 64) -> None:
        """Everything a run keeps, built fresh: what the constructor does, so a pooled
        actor (engines/ray/pool.py) starts a run as a new one would."""
        self.name = name
        self.shard = Shard(shard_id, blocks, spec, values)
        self.lock = threading.Lock()
        self.successor: Any = None
        self.mode = "none"
        self.forwarded = 0
        self._queue: queue.Queue[tuple[int, int, Tensors, float] | None] = queue.Queue(max_lag)
        self._forwarder: threading.Thread | None = None
        self._rounds: set[int] = set()
        self._persist: threading.Thread | None = None  # set only once started
        self._persist_error: str | None = None
        self._ckpt_lock = threading.Lock()
        self.x0 = {n: v.clone() for n, v in values.items()}
        self._saver: ShardCheckpoint | None = None
        self.zk: Any = None

    def release(self) -> bool:
        """The run is over: stop forwarding, finish a persist in flight, and let the
        pending ``watch`` return, so the actor can wait in the pool for ``reset``.

        Returns:
            False if it cannot be reused (a ZooKeeper session, a forwarder that does
            not stop): the driver kills it.
        """
        if self.zk is not None:
            return False
        forwarder, self.successor = self._forwarder, None  # the forwarder drops the rest
        if forwarder is not None:
            self._queue.put(None)
            forwarder.join(timeout=5)
            if forwarder.is_alive():
                return False
        with self._ckpt_lock:
            self._wait_persist()
        dead, self._dead = self._dead, threading.Event()
        dead.set()  # the previous run's ``watch`` returns; the next one waits anew
        return True

    def become(self, shard_id: int, blocks: tuple[RowBlock, ...], values: Tensors) -> None:
        """Turn a warm spare into a replica of ``shard_id`` (fresh state)."""
        with self.lock:
            self.shard = Shard(shard_id, blocks, self.shard.spec, values)
            self.x0 = {n: v.clone() for n, v in values.items()}
            self._saver = None
            self._rounds.clear()

    def join_coordinator(self, hosts: str, namespace: str, chain: str,
                         session_timeout: float) -> str:
        """Register in ZooKeeper: an ephemeral sequential node tied to this process's
        session, so the node (and this replica's membership) vanishes when it dies.
        Like the paper's replicas, it also watches its predecessor's node."""
        from trainthrough.coord.zookeeper import ZooKeeperCoordinator

        self.zk = ZooKeeperCoordinator(hosts, namespace=namespace,
                                       session_timeout=session_timeout)
        seq = self.zk.join(chain, self.name)
        self.predecessor: str | None = None
        self.zk.watch_predecessor(chain, self.name, self._on_predecessor)
        return seq

    def _on_predecessor(self, predecessor: str | None) -> None:
        self.predecessor = predecessor  # None: this replica is the head now

    # -- liveness ---------------------------------------------------------------
    def pid(self) -> int:
        return os.getpid()

    def whoami(self) -> tuple[int, str]:
        """(pid, node id): the driver signals this process only if it is on its node."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def watch(self) -> None:
        """Returns only when a run releases the actor (``release``): while it serves,
        the caller gets ActorDiedError on its death and nothing else."""
        self._dead.wait()

    # -- data path --------------------------------------------------------------
    def pull(self) -> tuple[int, Tensors]:
        with self.lock:
            return self.shard.version, {n: v.clone() for n, v in self.shard.values.items()}

    def push(self, worker: int, seq: int, update: Tensors, scale: float = 1.0) -> int:
        """Apply a worker's push once and replicate it; returns the version.

        Sync chains: returns after the successor (recursively the tail) returned, so
        an acknowledged push is on every live replica. A duplicate (re-delivered or
        retried) push is not applied again but is still forwarded, because a
        successor may have missed it when the chain broke mid-write.
        """
        with self.lock:
            self.shard.apply_once(worker, seq, update, scale)
            version = self.shard.version
            if self.mode == "sync" and self.successor is not None:
                ray.get(self.successor.push.remote(worker, seq, update, scale))
                self.forwarded += 1
        if self.mode == "async" and self.successor is not None:
            self._queue.put((worker, seq, update, scale))  # blocks when max_lag behind
        return version

    def apply_round(self, round_no: int, divide_by: int, *updates: Tensors) -> int:
        """Bulk-synchronous round: the aggregate of all workers' slices, applied once
        (``Shard.apply_aggregate``, as every engine does).

        Idempotent per round: a round retried after a failure elsewhere is skipped here
        if this shard already applied it.
        """
        with self.lock:
            if round_no in self._rounds:
                return self.shard.version
            self.shard.apply_aggregate(list(updates), divide_by)
            self._rounds.add(round_no)
            if len(self._rounds) > 64:
                self._rounds = set(sorted(self._rounds)[-32:])
            return self.shard.version

    # -- replication and recovery ----------------------------------------------
    def state(self) -> Tensors:
        with self.lock:
            return clone_state(self.shard.state_dict())

    def load(self, state: Tensors) -> int:
        with self.lock:
            self.shard.load_state_dict(state)
            return self.shard.version

    def load_rows(self, name: str, rows: torch.Tensor, values: torch.Tensor,
                  opt: Tensors) -> None:
        with self.lock:
            self.shard.load_rows(name, rows, values, opt)

    def set_successor(self, successor: Any, mode: str) -> None:
        """Rewire the chain. Async: start the forwarding thread on first use."""
        with self.lock:
            self.successor, self.mode = successor, mode
        if mode == "async" and self._forwarder is None:
            self._forwarder = threading.Thread(target=self._forward_loop, daemon=True)
            self._forwarder.start()

    def attach_tail(self, newcomer: Any, mode: str) -> int:
        """Copy state into ``newcomer`` and make it this replica's successor, atomically
        with respect to pushes, so the newcomer misses nothing."""
        with self.lock:
            ray.get(newcomer.load.remote(clone_state(self.shard.state_dict())))
            self.successor, self.mode = newcomer, mode
            version = self.shard.version
        if mode == "async" and self._forwarder is None:
            self._forwarder = threading.Thread(target=self._forward_loop, daemon=True)
            self._forwarder.start()
        return version

    def _forward_loop(self) -> None:
        """Forward queued pushes in order. When the successor dies the driver rewires
        the chain; the push is retried (for up to 2 s) to whoever the successor is
        then, and the successor's dedup makes a repeat harmless."""
        import time

        while True:
            item = self._queue.get()
            if item is None:
                return
            for _ in range(200):
                succ = self.successor
                if succ is None:
                    break  # this replica is the tail now: nothing to forward
                try:
                    ray.get(succ.push.remote(*item))
                    self.forwarded += 1
                    break
                except ray.exceptions.RayError:
                    time.sleep(0.01)

    # -- checkpoints (the shard writes its own; the driver only says when) ---------
    # What is saved and restored is ShardCheckpoint, the same code the sim engine runs.
    # The actor is threaded: checkpoint and restore calls may arrive together. One lock
    # orders them, and a background persist is only ever recorded once started, so
    # there is never a second persist while one runs, never a join of a thread that
    # has not started, and a failed persist is reported (``error``) in the next result.
    def _wait_persist(self) -> dict[str, str]:
        """Wait for the background persist (caller holds ``_ckpt_lock``); its failure."""
        if self._persist is not None:
            self._persist.join()
            self._persist = None
        error, self._persist_error = self._persist_error, None
        return {"error": error} if error else {}

    def _checkpoints(self, url: str, keep: int, seed: int) -> ShardCheckpoint:
        if self._saver is None or self._saver.store.url != url:
            from trainthrough.ft.checkpoint import CheckpointStore

            self._saver = ShardCheckpoint(self.shard, self.x0, CheckpointStore(url, keep), seed)
        return self._saver

    def _persist_run(self, saver: ShardCheckpoint, plan: Planned) -> None:
        try:
            saver.write(plan)
        except Exception as e:  # reported by the next checkpoint or restore call
            self._persist_error = f"checkpoint {plan.tag} step {plan.step} was not written: {e}"

    def checkpoint(self, url: str, keep: int, seed: int, decision: CheckpointDecision,
                   iteration: int) -> dict[str, Any]:
        """Save this shard as ``decision`` says (full, or a prioritized fraction).

        Sync: the lock is held while writing, so pushes block (that is the cost).
        Async: only the in-memory snapshot holds the lock; a background thread
        persists it. A persist still running is waited for first: never two at once.

        Returns:
            ``bytes`` written (sync; async: the payload), ``payload`` bytes, ``blocked``
            seconds, the checkpoint ``name`` (None: nothing to save yet); ``error`` if
            this save (sync) or the previous background one failed.
        """
        t0 = time.perf_counter()
        with self._ckpt_lock:
            out: dict[str, Any] = self._wait_persist()
            saver = self._checkpoints(url, keep, seed)
            with self.lock:
                plan = saver.plan(decision, iteration)
                if plan is None:
                    return {"bytes": 0, "payload": 0, "blocked": 0.0, "name": None, **out}
                name: str | None = f"{plan.tag}-{plan.step:08d}"
                if not decision.asynchronous:
                    try:
                        nbytes = saver.write(plan).nbytes
                    except Exception as e:
                        nbytes, name = 0, None
                        out = {"error": f"checkpoint {plan.tag} step {plan.step} "
                                        f"was not written: {e}"}
                    return {"bytes": nbytes, "payload": plan.payload_bytes, "name": name,
                            "blocked": time.perf_counter() - t0, **out}
            blocked = time.perf_counter() - t0
            thread = threading.Thread(target=self._persist_run, args=(saver, plan), daemon=True)
            thread.start()
            self._persist = thread
        return {"bytes": plan.payload_bytes, "payload": plan.payload_bytes, "name": name,
                "blocked": blocked, **out}

    def restore(self, url: str, keep: int, seed: int,
                at_most: int | None = None) -> dict[str, Any]:
        """Load this shard's freshest valid save (after its own persist in flight).

        Returns:
            ``step``: the iteration restored to, None if nothing valid was saved (the
            shard restarts from its initial values); ``skipped``: one message per
            corrupt save, naming it and why; ``error`` if a background persist failed.
        """
        skipped: list[str] = []
        with self._ckpt_lock:
            out = self._wait_persist()
            saver = self._checkpoints(url, keep, seed)
            with self.lock:
                step = saver.restore(skipped.append, at_most=at_most)
                # Rounds after the restored step are undone: replayed, they must apply.
                self._rounds = {r for r in self._rounds if step is not None and r < step}
        return {"step": step, "skipped": skipped, **out}

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.shard.version, "forwarded": self.forwarded,
                "lag": self._queue.qsize(), "applied": dict(self.shard.applied)}
