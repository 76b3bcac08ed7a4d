"""A parameter-server shard (or one replica of its chain) hosted in a Ray actor.

The actor is a thin host around :class:`trainthrough.ps.shard.Shard`: the same
update, dedup and state code as every engine. What it adds is process-level:
its pid (failures are real SIGKILLs), a ``watch`` call that only returns when the
process dies (Ray's death notification, without polling), and chain replication
(:mod:`~trainthrough.engines.ray.chain.chain_link`): each applied push is forwarded to the
successor at once, pipelined, in chain-position order; synchronously (acknowledged
once the tail has it) or asynchronously (at most ``max_lag`` pushes ahead).

Threaded actor: ``watch`` parks one thread for good; pushes from several workers run
on the others and a lock orders them, so every replica applies pushes in one order.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import ray
import torch

from trainthrough.engines.ray.actors.persister import Persister, not_written
from trainthrough.engines.ray.actors.reports import (
    CheckpointStats,
    Pulled,
    RestoreInfo,
    SaveInfo,
    ShardStats,
)
from trainthrough.engines.ray.chain import wire
from trainthrough.engines.ray.chain.audit import Audit
from trainthrough.engines.ray.chain.chain_link import ChainLink, Replica
from trainthrough.engines.ray.chain.link_socket import Address, Listener
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.shard_checkpoint import ShardCheckpoint
from trainthrough.ft.worker_copy import recover_from_replies
from trainthrough.ps.layout import RowBlock
from trainthrough.ps.shard import Shard, clone_state
from trainthrough.workloads.base import OptimizerSpec

Tensors = dict[str, torch.Tensor]


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=32)  # type: ignore[call-overload]
class ShardActor:
    """One shard replica. ``mode``: ``none`` (no successor), ``sync`` or ``async``."""

    def __init__(self, shard_id: int, blocks: tuple[RowBlock, ...], spec: OptimizerSpec,
                 values: Tensors, name: str, max_lag: int = 64) -> None:
        torch.set_num_threads(1)
        self._dead = threading.Event()  # released (set) only when a run gives it back
        # Where predecessors connect to forward (one per process, kept across runs).
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        self.reset(shard_id, blocks, spec, values, name, max_lag)

    def reset(self, shard_id: int, blocks: tuple[RowBlock, ...], spec: OptimizerSpec,
              values: Tensors, name: str, max_lag: int = 64) -> None:
        """Everything a run keeps, built fresh: what the constructor does, so a pooled
        actor (engines/ray/driver/pool.py) starts a run as a new one would."""
        self.name = name
        self.shard = Shard(shard_id, blocks, spec, values)
        # A condition, so chain pushes can wait for their turn or their acknowledgement
        # without holding the shard.
        self.lock = threading.Condition()
        self.link = ChainLink(self.lock, _ShardReplica(self), max_lag)
        self._rounds: set[int] = set()
        self._persister = Persister()
        self._ckpt_lock = threading.Lock()
        self.x0 = {n: v.clone() for n, v in values.items()}
        self._saver: ShardCheckpoint | None = None
        self.zk: Any = None
        previous: Audit | None = getattr(self, "audit", None)
        if previous is not None:  # a pooled actor's previous run
            previous.close()
        self.audit = Audit(name)  # what it acknowledged, if asked (chain/audit.py)

    def release(self) -> bool:
        """The run is over: stop forwarding, finish a persist in flight, and let the
        pending ``watch`` return, so the actor can wait in the pool for ``reset``.

        Returns:
            False if it cannot be reused (a ZooKeeper session, a forwarder that does
            not stop): the driver kills it.
        """
        if self.zk is not None or not self.link.close():
            return False
        with self._ckpt_lock:
            self._persister.wait()
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
            self.link.reset(0, 0)

    def join_coordinator(self, hosts: str, namespace: str, chain: str,
                         session_timeout: float) -> bool:
        """Register in ZooKeeper: an ephemeral sequential node tied to this process's
        session, so the node (and this replica's membership) vanishes when it dies.
        Like the paper's replicas, it also watches its predecessor's node.

        Called again after the session expired while this process lived (a pause of
        the server or of this machine): joins anew in the new session. Every ZooKeeper
        call is bounded (the coordinator's connect timeout).

        Returns:
            True if it joined now, False if it already was a member in a live session.

        Raises:
            CoordinatorError, UserError: ZooKeeper did not answer; the driver retries.
        """
        from trainthrough.coord.zookeeper import ZooKeeperCoordinator

        if self.zk is None:
            self.zk = ZooKeeperCoordinator(hosts, namespace=namespace,
                                           session_timeout=session_timeout)
        if self.zk.joined(chain, self.name):
            return False
        self.zk.join(chain, self.name)
        self.predecessor: str | None = None
        self.zk.watch_predecessor(chain, self.name, self._on_predecessor)
        return True

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
    def pull(self) -> Pulled:
        with self.lock:
            return Pulled(self.shard.version,
                          {n: v.clone() for n, v in self.shard.values.items()})

    def push(self, worker: int, seq: int, update: Tensors, scale: float = 1.0) -> int:
        """Apply a worker's push once and replicate it; returns the version.

        Chains (:class:`~trainthrough.engines.ray.chain.chain_link.ChainLink`): the push is
        forwarded at once, pipelined behind the pushes still in flight. Sync: returns
        once the tail has it, so an acknowledged push is on every live replica; a
        duplicate (re-delivered or retried) push is not applied again and returns once
        everything applied here is on the tail. Raises ``ChainBroken`` when the chain
        broke under it: the sender retries the same sequence number.
        """
        with self.lock:
            if self.link.mode == "none":  # no chain: nothing to order or forward
                self.shard.apply_once(worker, seq, update, scale)
            else:
                self.link.from_worker(wire.Item(worker, seq, update, scale))
            self.audit.acked(self.link.gen, self.link.pos, worker, seq)  # answered next
            return self.shard.version

    def chain_address(self) -> Address:
        """Where a predecessor connects to forward (link_socket): this node's IP, a
        port of its own, and the token a connection must send first."""
        with self._listener_lock:
            if self._listener is None:
                self._listener = Listener(ray.util.get_node_ip_address(), self._forwarded)
            return self._listener.address

    def _forwarded(self, header: dict[str, Any], payload: Any) -> None:
        """A forward that came over a predecessor's connection (on that connection's
        thread): as :meth:`chain_push` or :meth:`chain_state` with it."""
        op, gen, pos, what = wire.from_frame(header, payload)  # outside the lock
        with self.lock:
            if op == "state":
                self.link.from_state(gen, pos, what)
            else:
                self.link.from_predecessor(gen, pos, what)

    def chain_push(self, gen: int, first: int, items: list[wire.Item]) -> None:
        """Pushes forwarded by this replica's predecessor at chain positions ``first``
        on, by Ray call: those of dtypes a frame cannot carry (see :meth:`push`)."""
        with self.lock:
            self.link.from_predecessor(gen, first, items)

    def chain_state(self, gen: int, pos: int, state: Tensors) -> None:
        """The predecessor's whole state at chain position ``pos`` (it holds every push
        up to there), by Ray call: a state a frame cannot carry."""
        with self.lock:
            self.link.from_state(gen, pos, state)

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

    def load(self, state: Tensors, chain: tuple[int, int] | None = None) -> int:
        """Take ``state`` (and, joining a chain, the (generation, position) it is at)."""
        with self.lock:
            self.shard.load_state_dict(state)
            if chain is not None:
                self.link.reset(*chain)
            return self.shard.version

    def load_rows(self, name: str, rows: torch.Tensor, values: torch.Tensor,
                  opt: Tensors) -> None:
        with self.lock:
            self.shard.load_rows(name, rows, values, opt)

    def set_successor(self, successor: Any, mode: str) -> None:
        """Rewire the chain: ``successor`` (None: this replica is the tail) gets every
        push not yet acknowledged, in order."""
        with self.lock:
            self.link.rewire(successor, mode)

    def lead(self) -> int:
        """Made head by the driver (its head was lost): lead a new generation now
        (:meth:`ChainLink.lead`); returns it."""
        with self.lock:
            self.link.lead()
            return self.link.gen

    def attach_tail(self, newcomer: Any, mode: str, timeout: float) -> int:
        """Copy state (and chain position) into ``newcomer`` and make it this replica's
        successor, atomically with respect to pushes, so the newcomer misses nothing.

        Pushes wait on the lock meanwhile, so a newcomer that hangs (stopped, or its
        node unreachable) must not hold them for ever: after ``timeout`` seconds this
        raises ``GetTimeoutError`` with nothing changed, and the driver tries again.
        """
        with self.lock:
            ray.get(newcomer.load.remote(clone_state(self.shard.state_dict()),
                                         (self.link.gen, self.link.pos)), timeout=timeout)
            self.link.rewire(newcomer, mode)
            return self.shard.version

    # -- checkpoints (the shard writes its own; the driver only says when) ---------
    # What is saved and restored is ShardCheckpoint, the same code the sim engine runs;
    # how a write is run (inline or in the background, one at a time) is the Persister.
    # The actor is threaded: checkpoint and restore calls may arrive together, so
    # ``_ckpt_lock`` orders them.
    def _checkpoints(self, url: str, keep: int, seed: int) -> ShardCheckpoint:
        if self._saver is None or self._saver.store.url != url:
            from trainthrough.ft.checkpoint import CheckpointStore

            self._persister.wait()  # the old saver's buffer may still be being written
            self._saver = ShardCheckpoint(self.shard, self.x0, CheckpointStore(url, keep), seed,
                                          reuse_snapshot=True)
        return self._saver

    def checkpoint(self, url: str, keep: int, seed: int, decision: CheckpointDecision,
                   iteration: int) -> SaveInfo:
        """Save this shard as ``decision`` says (full, or a prioritized fraction).

        One path for both modes: snapshot under the shard's lock, then write. Sync: the
        write runs with the lock held, so pushes block (that is the cost). Async: only
        the snapshot (a copy into a preallocated buffer) holds the lock; the write runs
        on the persister's thread. An async save due while the previous write still
        runs is skipped (``skipped``), never queued and never run alongside it.

        Returns:
            What was saved (:class:`~.reports.SaveInfo`); ``error`` if this save (sync)
            or the previous background one failed.
        """
        t0 = time.perf_counter()
        with self._ckpt_lock:
            error = self._persister.take_error()
            if decision.asynchronous and self._persister.busy():
                self._persister.skip()
                return _saved(error, skipped=True)
            self._persister.wait()  # sync after async (a restore's strategy): one at a time
            saver = self._checkpoints(url, keep, seed)
            with self.lock:
                plan = saver.plan(decision, iteration)
                if plan is None:
                    return _saved(error)
                name: str | None = f"{plan.tag}-{plan.step:08d}"
                what = f"checkpoint {plan.tag} step {plan.step}"
                if not decision.asynchronous:
                    try:
                        nbytes = self._persister.run(lambda: saver.write(plan)).nbytes
                    except Exception as e:
                        nbytes, name, error = 0, None, not_written(what, e)
                    return _saved(error, nbytes, plan.payload_bytes,
                                  time.perf_counter() - t0, name)
            blocked = time.perf_counter() - t0
            self._persister.start(lambda: saver.write(plan), what)
        return _saved(error, plan.payload_bytes, plan.payload_bytes, blocked, name)

    def checkpoint_stats(self) -> CheckpointStats:
        """Writes done, saves skipped (a write was still running), seconds writing, and
        the store's split of the last write (durable write, prune)."""
        write, prune = self._saver.store.last_timing if self._saver is not None else (0.0, 0.0)
        done = self._persister.stats()
        return CheckpointStats(writes=done["writes"], skipped=done["skipped"],
                               seconds=done["seconds"], last_write=write, last_prune=prune)

    def restore(self, url: str, keep: int, seed: int,
                at_most: int | None = None) -> RestoreInfo:
        """Load this shard's freshest valid save (after its own persist in flight).

        Returns:
            ``step``: the iteration restored to, None if nothing valid was saved (the
            shard restarts from its initial values); ``skipped``: one message per
            corrupt save, naming it and why; ``error`` if a background persist failed.
        """
        skipped: list[str] = []
        with self._ckpt_lock:
            self._persister.wait()
            error = self._persister.take_error()
            saver = self._checkpoints(url, keep, seed)
            with self.lock:
                step = saver.restore(skipped.append, at_most=at_most)
                # Rounds after the restored step are undone: replayed, they must apply.
                self._rounds = {r for r in self._rounds if step is not None and r < step}
        info = RestoreInfo(step=step, skipped=skipped)
        if error:
            info["error"] = error
        return info

    def recover_from_workers(self, from_checkpoint: bool, lost_version: int | None,
                             round_size: int, divide_by: int, asked: int,
                             *replies: Any) -> dict[str, Any]:
        """Worker-copy recovery (after :meth:`restore`, or on a fresh shard): this
        shard's rows from the freshest worker copy (``replies``: workers' ``copy_rows``,
        passed by reference from worker to shard), then the missed bulk-synchronous
        round replayed when whole (ft/worker_copy.py)."""
        with self.lock:
            return recover_from_replies(self.shard, [r for r in replies if r is not None],
                                        from_checkpoint, lost_version, round_size, divide_by,
                                        asked)

    def stats(self) -> ShardStats:
        with self.lock:
            self.audit.state(self.link.gen, self.link.pos, self.shard.version,
                             self.shard.applied)
            return ShardStats(name=self.name, version=self.shard.version,
                              forwarded=self.link.forwarded, sent_states=self.link.sent_states,
                              socket_sends=self.link.forwarder.socket_sends,
                              lag=self.link.lag, position=self.link.pos,
                              applied=dict(self.shard.applied), held=dict(self.shard.held))


def _saved(error: str | None, nbytes: int = 0, payload: int = 0, blocked: float = 0.0,
           name: str | None = None, skipped: bool = False) -> SaveInfo:
    info = SaveInfo(bytes=nbytes, payload=payload, blocked=blocked, name=name, skipped=skipped)
    if error:
        info["error"] = error
    return info


class _ShardReplica(Replica):
    """The actor's shard as its chain link sees it (the actor may swap the shard:
    ``reset``, ``become``, so it is looked up on every call)."""

    def __init__(self, actor: ShardActor) -> None:
        self.actor = actor

    def apply(self, worker: int, seq: int, update: Any, scale: float) -> bool:
        return self.actor.shard.apply_once(worker, seq, update, scale)

    def state(self) -> Tensors:
        return self.actor.shard.state_dict()

    def load(self, state: Tensors) -> None:
        self.actor.shard.load_state_dict(state)
