"""The run configuration: typed, validated early, written back as ``config.toml``.

Every field is documented here, and every error names the field to change. A run
folder's ``config.toml`` is the fully resolved config and can be re-run as is
(``trainthrough run --config runs/X/config.toml``).

Contract: this module knows the config and nothing it names. It imports only
:mod:`trainthrough.fields` and :mod:`trainthrough.errors` (never torch, an engine, a
workload, a strategy or a failure spec), so it loads anywhere, fast; every layer above
reads it (the import contract in ``pyproject.toml`` enforces the direction).

Validation comes in two parts:

- here, what the config alone can tell: each field's type comes from its annotation and
  its accepted values from the :class:`~trainthrough.fields.Bounds` next to its default
  (:func:`~trainthrough.fields.check_fields`, from a TOML file, the command line, or
  code alike), and :meth:`RunConfig.validate` adds the rules that relate fields to each
  other (:meth:`RunConfig.check_relations`);
- above, in :func:`trainthrough.lab.validate.validate_run`, what needs the things the
  names refer to: the workload and its options, the strategy, the failure specs and
  what the chosen engine claims. Every run is checked by that one before it starts.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomli_w

from trainthrough.errors import UserError
from trainthrough.fields import SEED_MAX, bounded, check_fields, show

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The device names ``--device`` takes (what exists is checked where torch is known).
#: Matched with ``fullmatch``: ``$`` also matches before a trailing newline, so
#: ``match`` took ``"cuda\n"`` and the refusal came later, the newline hidden in it.
DEVICE_NAME = re.compile(r"(auto|cpu|cuda(:[0-9]+)?)")
# Engine names (aliases included) for the field's choices; what each engine runs is
# declared by the engine itself (engines/registry.py), never here.
ENGINES = ("sim", "ray", "gloo", "dist")
PARADIGMS = {"ps": "parameter server: K shards own the parameters, N workers push updates",
             "dp": "data parallel: N ranks each hold a replica and allreduce gradients"}
#: Fields ``trainthrough run`` sets with a flag of the same name (``--max-iterations``);
#: ``failures`` is ``--fail`` and ``workload_options`` is ``--option``.
FLAG_FIELDS = (
    "workload", "strategy", "engine", "paradigm", "ranks", "elastic", "shards", "workers",
    "consistency", "staleness", "seed", "checkpoint_every", "checkpoint_keep", "checkpoint_dir",
    "checkpoint_fraction", "checkpoint_rule", "max_iterations", "eval_every", "target", "lr",
    "baseline", "ray_address", "bind_address", "checkpoint_shared", "keep_warm", "recovery_delay",
    "replicas", "coordinator", "zookeeper_hosts", "merge_rule", "merge_threshold", "wall_limit",
    "allreduce_buckets", "micro_batches", "device", "collective", "sync_every", "sync_fragments",
    "liveness_timeout", "max_restarts", "straggler_deadline")


def flag_label(name: str) -> str:
    """How the command line spells field ``name`` (``cost.x`` and the rest: as the key)."""
    special = {"failures": "--fail", "workload_options": "--option"}
    if name in special:
        return special[name]
    return f"--{name.replace('_', '-')}" if name in FLAG_FIELDS else name


def field_choices(name: str) -> tuple[str, ...]:
    """The names :class:`RunConfig` field ``name`` accepts (for ``--help`` and argparse)."""
    bounds = next(f for f in fields(RunConfig) if f.name == name).metadata["bounds"]
    return bounds.choices  # type: ignore[no-any-return]


@dataclass
class CostModel:
    """What the ``sim`` engine charges to its virtual clock (seconds, bytes/s)."""

    compute_scale: float = bounded(1.0, ge=0)  #: multiplies the workload's per-step compute time
    network_bandwidth: float = bounded(1.25e9, gt=0)  #: bytes/s per server link (10 Gb/s)
    network_latency: float = bounded(0.0005, ge=0)  #: seconds per request
    storage_bandwidth: float = bounded(2.0e8, gt=0)  #: bytes/s to checkpoint storage (200 MB/s)
    memory_bandwidth: float = bounded(5.0e9, gt=0)  #: bytes/s for in-memory snapshots (async persist)
    detection_seconds: float = bounded(1.0, ge=0)  #: failure to detection
    restart_seconds: float = bounded(5.0, ge=0)  #: detection to a replacement being up
    #: dp: survivors build a new group (rendezvous, communicator)
    reform_seconds: float = bounded(0.5, ge=0)
    #: dp: failure to a replacement rank joining the running group
    replace_seconds: float = bounded(5.0, ge=0)
    #: dp: collective timeout, how long a hung rank goes unnoticed
    timeout_seconds: float = bounded(10.0, ge=0)


@dataclass
class RunConfig:
    """Everything a run needs. Defaults marked None resolve from the workload."""

    workload: str = "mlr"  #: workload name (``trainthrough list``)
    strategy: str = "checkpoint-restart"  #: preset or composition
    engine: str = bounded("sim", choices=ENGINES)  #: sim, ray or gloo (alias dist)
    #: ps (parameter server) or dp (data parallel, allreduce)
    paradigm: str = bounded("ps", choices=tuple(PARADIGMS))
    shards: int = bounded(4, ge=1)  #: parameter-server shards K
    workers: int = bounded(4, ge=1)  #: workers N
    #: bsp, ssp (sim: bounded staleness) or async (ray)
    consistency: str = bounded("bsp", choices=("bsp", "ssp", "async"))
    staleness: int = bounded(2, ge=0)  #: SSP bound s (ignored under bsp)
    ranks: int = bounded(4, ge=1)  #: dp: data-parallel ranks N (each holds a full replica)
    #: dp: keep-global (larger per-rank batch) or keep-local
    elastic: str = bounded("keep-global", choices=("keep-global", "keep-local"))
    #: dp: gradient buckets, one allreduce each (allreduce:K failures hit between
    #: them); the last carries the commit vote. None: buckets of about 25 MB (DDP's
    #: bucket_cap_mb; one for a model under ~7M parameters), started during the backward
    allreduce_buckets: int | None = bounded(None, ge=1)
    #: dp: micro-batches per rank at the nominal batch, one gradient call each (more
    #: spread a lost rank's share more evenly over the survivors: 4 over 3 ranks
    #: run 2/1/1, 16 run 6/5/5)
    micro_batches: int = bounded(1, ge=1)
    #: dp, your own loop: where each rank's replica computes (``loop.device``): auto (a
    #: GPU per local rank when CUDA is present, else the CPU), cpu, cuda or cuda:N
    device: str = "auto"
    #: dp: the collective: auto (NCCL when every rank of a host has a GPU of its own,
    #: else gloo), gloo or nccl
    collective: str = bounded("auto", choices=("auto", "gloo", "nccl"))
    replace: bool = True  #: dp: failed ranks are replaced after cost.replace_seconds
    #: dp, relaxed sync (localsgd, diloco, streaming-diloco): H, inner steps between two
    #: outer steps (of each fragment)
    sync_every: int = bounded(10, ge=1)
    #: streaming-diloco: F, fragments of the model, each with its own staggered outer
    #: step (at most sync_every)
    sync_fragments: int = bounded(2, ge=1)
    #: diloco: the outer optimizer's learning rate (SGD with Nesterov momentum)
    outer_lr: float = bounded(0.7, gt=0)
    #: diloco: the outer optimizer's momentum (0: plain SGD)
    outer_momentum: float = bounded(0.9, ge=0, le=0.999)
    failures: list[str] = field(default_factory=list)  #: failure specs
    seed: int = bounded(0, ge=0, le=SEED_MAX)  #: one seed for everything random in the run
    max_iterations: int | None = bounded(ge=1)  #: stop after this many executed iterations
    #: evaluate every this many iterations (iterations to target stay exact to one
    #: iteration: engines/evaluation.py)
    eval_every: int | None = bounded(ge=1)
    #: bytes of parameter copies held between two evaluations for the look-back that
    #: locates the iteration to target (engines/evaluation.py); copies beyond it are not
    #: kept, and ``target_resolution`` says how exact the result is then
    lookback_bytes: int = bounded(64 * 2**20, ge=0)
    target: float | None = None  #: convergence target (default: the workload's)
    stop_at_target: bool = True  #: end the run when the target is reached
    past_target: float = bounded(0.0, ge=0)  #: ...after this many more iterations, as a fraction
    checkpoint_every: int | None = bounded(ge=1)  #: N, iterations between full checkpoints
    checkpoint_keep: int = bounded(3, ge=1)  #: full checkpoints kept
    #: r, prioritized: fraction saved every r*N iterations (``None``: 1/N, the bytes of
    #: a full checkpoint spread over every iteration)
    checkpoint_fraction: float | None = bounded(0.25, gt=0, le=1)
    #: prioritized: largest-change, random, round-robin
    checkpoint_rule: str = bounded("largest-change",
                              choices=("largest-change", "random", "round-robin"))
    checkpoint_dir: str | None = None  #: path or fsspec URL (default: <out>/checkpoints)
    #: with --ray-address: --checkpoint-dir is a folder every host of the cluster mounts
    #: (a shared filesystem), so a checkpoint-restart may restore from it on any host
    checkpoint_shared: bool = False
    lr: float | None = bounded(gt=0)  #: override the workload's server step size
    baseline: bool = False  #: also run failure-free with the same seed for rework cost
    #: passed to the workload (checked against its signature: workloads/options.py)
    workload_options: dict[str, Any] = field(default_factory=dict)
    # -- real engines (ray) ---------------------------------------------------------
    ray_address: str | None = None  #: join this Ray cluster instead of starting one
    #: data parallel: the address of this machine the controller's store (and local
    #: ranks' gloo) listen on (default: 127.0.0.1; on a joined cluster its Ray address)
    bind_address: str | None = None
    #: with ray_address: leave this run's clean actors on the cluster, warm, for later
    #: runs, each ended after this many idle seconds (``trainthrough release`` ends them)
    keep_warm: float | None = bounded(gt=0)
    #: seconds a lost shard, worker or (dist) rank stays down
    recovery_delay: float = bounded(0.0, ge=0)
    replicas: int = bounded(3, ge=1)  #: chain length R per shard (chain strategies)
    max_lag: int = bounded(64, ge=1)  #: chain-async: pushes the head may run ahead of its successor
    coordinator: str = bounded("ray", choices=("ray", "zookeeper"))  #: ray (named actor) or zookeeper
    zookeeper_hosts: str | None = None  #: host:port of ZooKeeper (coordinator=zookeeper)
    #: stateless backlog: sum, mean, scaled (paper), staleness
    merge_rule: str = bounded("mean", choices=("sum", "mean", "scaled", "staleness"))
    merge_threshold: int = bounded(50, ge=1)  #: stateless 'scaled': backlog size that keeps full steps
    backlog: int = bounded(256, ge=2)  #: stateless: buffered updates per shard before merging oldest
    wall_limit: float | None = bounded(gt=0)  #: real engines: stop after this many seconds
    #: dp (gloo, ray): seconds a rank process's heartbeat may stop before it is taken for
    #: dead (ended, and recovered as a failure). Its process beats from a thread of its
    #: own, so a rank that computes, however long its step or evaluation, never is.
    liveness_timeout: float = bounded(30.0, gt=0)
    #: dp (gloo, ray): how many times in a row a failure nobody injected may repeat the
    #: same way (the same error, the run no further) and be recovered; the next one ends
    #: the run with that error (0: the first one does)
    max_restarts: int = bounded(3, ge=0)
    #: dp (gloo, sim): seconds the members of a group wait for each other in a step's
    #: collective; a member that has not come by then (a straggler) is dropped, the step
    #: committed without it as the strategy recovers a lost rank, and a replacement takes
    #: its place. None (the default): the group waits for it, up to the collective
    #: timeout (cost.timeout_seconds), which the deadline must be shorter than. Also the
    #: longest the first member may evaluate or save between two steps.
    straggler_deadline: float | None = bounded(gt=0)
    cost: CostModel = field(default_factory=CostModel)

    def validate(self) -> None:
        """Check every field, then the rules between fields that need nothing but the config.

        Not everything a run needs: the workload, its options, the strategy, the failure
        specs and the engine's claims are checked by
        :func:`trainthrough.lab.validate.validate_run`, which every run goes through.

        Raises:
            UserError: naming the field (as its command-line flag) and what to change.
        """
        check_fields(self, flag_label)
        self.check_relations()

    def check_relations(self) -> None:
        """The rules between fields (the coordinator and its hosts, ``keep_warm`` and
        what it needs, the checkpoint storage URL), each field's own value assumed checked.

        Raises:
            UserError: naming the flags involved and what to change.
        """
        if self.zookeeper_hosts and self.coordinator != "zookeeper":
            raise UserError("--zookeeper-hosts is only used with --coordinator zookeeper: "
                            "add it, or drop --zookeeper-hosts")
        if self.keep_warm is not None and (self.engine != "ray" or self.paradigm != "ps"
                                           or not self.ray_address):
            raise UserError("--keep-warm keeps parameter-server actors on a Ray cluster that "
                            "outlives the run: it needs --engine ray --ray-address ADDR "
                            "(and --paradigm ps)")
        if not DEVICE_NAME.fullmatch(self.device):
            raise UserError(f"--device {self.device!r}: use auto, cpu, cuda or cuda:N")
        if self.checkpoint_shared and not (self.ray_address and self.checkpoint_dir):
            raise UserError("--checkpoint-shared declares that --checkpoint-dir is a folder "
                            "every host of a cluster mounts: it needs --ray-address and "
                            "--checkpoint-dir")
        if self.bind_address is not None:
            _check_bind_address(self.bind_address)
        if self.coordinator == "zookeeper" and not self.zookeeper_hosts:
            raise UserError("coordinator zookeeper needs --zookeeper-hosts host:port")
        if self.sync_fragments > self.sync_every:
            raise UserError(f"--sync-fragments ({self.sync_fragments}) cannot exceed "
                            f"--sync-every ({self.sync_every}): each fragment needs its own "
                            "inner step for its outer step")
        if self.straggler_deadline is not None \
                and self.straggler_deadline >= self.cost.timeout_seconds:
            raise UserError(f"--straggler-deadline ({self.straggler_deadline:g} s) must be "
                            "shorter than the collective timeout cost.timeout_seconds "
                            f"({self.cost.timeout_seconds:g} s), which ends every wait "
                            "first: lower it, or raise the timeout")
        _check_storage_url(self.checkpoint_dir)

    def changed_fields(self) -> dict[str, Any]:
        """The plain fields whose value is not their default (the ones a user set)."""
        out = {}
        for f in fields(self):
            if f.default is MISSING:  # lists, dicts, the cost model: not settings here
                continue
            v = getattr(self, f.name)
            if v != f.default:
                out[f.name] = v
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, ``None`` fields left out (TOML has no null)."""
        return _drop_none(asdict(self))

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from a dict (e.g. parsed TOML), every value checked by type and range.

        Raises:
            UserError: unknown keys, or a value of the wrong type or out of range,
                naming the key.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown key(s) {', '.join(unknown)}; known keys: "
                            f"{', '.join(sorted(known))}")
        data = dict(data)
        cost = data.pop("cost", {})
        if not isinstance(cost, dict):
            raise UserError(f"cost must be a table ([cost] with key = value lines), "
                            f"got {show(cost)}")
        bad = sorted(set(cost) - {f.name for f in fields(CostModel)})
        if bad:
            raise UserError(f"unknown cost key(s) {', '.join(bad)}")
        if isinstance(data.get("failures"), str):
            data["failures"] = [data["failures"]]
        cfg = cls(cost=CostModel(**cost), **data)
        check_fields(cfg)
        return cfg

    @classmethod
    def from_toml(cls, path: str | Path) -> RunConfig:
        """Read a config file.

        Raises:
            UserError: missing, unreadable or malformed file, or a bad value in it.
        """
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file {p} does not exist or is not a file")
        try:
            text = p.read_bytes().decode("utf-8-sig")  # a BOM is fine, tomllib refuses it
            return cls.from_dict(tomllib.loads(text))
        except OSError as e:
            raise UserError(f"config file {p}: cannot read it: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise UserError(f"config file {p} is not UTF-8 text (byte {e.start}); "
                            "save it as UTF-8") from None
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"config file {p} is not valid TOML: {e}") from None
        except UserError as e:
            raise UserError(f"config file {p}: {e}") from None


def baseline_config(cfg: RunConfig) -> RunConfig:
    """The failure-free twin of ``cfg`` (same seed, same everything but failures)."""
    return replace(cfg, failures=[], baseline=False, checkpoint_dir=None)


def _check_storage_url(url: str | None) -> None:
    """An fsspec URL must name a protocol fsspec knows and can load."""
    if not url or "://" not in url:
        return
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise UserError(f"--checkpoint-dir {url!r}: unknown storage protocol {protocol!r}; "
                        f"use a local path or one of fsspec's (file, memory, s3, gcs, ...)") \
            from None
    except ImportError as e:
        raise UserError(f"--checkpoint-dir {url!r}: protocol {protocol!r} needs a package "
                        f"that is not installed ({e})") from None


def _check_bind_address(text: str) -> str:
    """``--bind-address``: one IPv4 address that this machine holds (not 0.0.0.0).

    Raises:
        UserError: one line saying what is wrong and what to pass.
    """
    try:
        ip = ipaddress.IPv4Address(text)
    except ValueError:
        raise UserError(f"--bind-address {text!r} is not an IPv4 address "
                        "(e.g. 10.0.0.5: an address of this machine)") from None
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise UserError(f"--bind-address {text}: name one address of this machine "
                        "(listening on every interface is never done)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((str(ip), 0))
        except OSError as e:
            raise UserError(f"--bind-address {text} is not an address of this machine "
                            f"({e.strerror or e}); `ip -4 addr` lists them") from None
    return str(ip)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_drop_none(v) if isinstance(v, dict) else v)
            for k, v in d.items() if v is not None}
