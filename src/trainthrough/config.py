"""The run configuration: typed, validated early, written back as ``config.toml``.

Every field is documented here, and every error names the field to change. A run
folder's ``config.toml`` is the fully resolved config and can be re-run as is
(``trainthrough run --config runs/X/config.toml``).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from trainthrough.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENGINES = {"sim": "in-process, deterministic, virtual clock (the failure simulation framework)",
           "ray": "shards, replicas and workers as Ray actors; failures are real SIGKILLs",
           "dist": "data-parallel ranks as OS processes on a torch.distributed gloo group "
                   "(127.0.0.1); failures are real SIGKILL/SIGSTOP"}
PARADIGMS = {"ps": "parameter server: K shards own the parameters, N workers push updates",
             "dp": "data parallel: N ranks each hold a replica and allreduce gradients"}


@dataclass
class CostModel:
    """What the ``sim`` engine charges to its virtual clock (seconds, bytes/s)."""

    compute_scale: float = 1.0  #: multiplies the workload's per-step compute time
    network_bandwidth: float = 1.25e9  #: bytes/s per server link (10 Gb/s)
    network_latency: float = 0.0005  #: seconds per request
    storage_bandwidth: float = 2.0e8  #: bytes/s to checkpoint storage (200 MB/s)
    memory_bandwidth: float = 5.0e9  #: bytes/s for in-memory snapshots (async persist)
    detection_seconds: float = 1.0  #: failure to detection
    restart_seconds: float = 5.0  #: detection to a replacement being up
    reform_seconds: float = 0.5  #: dp: survivors build a new group (rendezvous, communicator)
    replace_seconds: float = 5.0  #: dp: failure to a replacement rank joining the running group
    timeout_seconds: float = 10.0  #: dp: collective timeout, how long a hung rank goes unnoticed


@dataclass
class RunConfig:
    """Everything a run needs. Defaults marked None resolve from the workload."""

    workload: str = "mlr"  #: workload name (``trainthrough list``)
    strategy: str = "checkpoint-restart"  #: preset or composition
    engine: str = "sim"  #: sim
    paradigm: str = "ps"  #: ps (parameter server) or dp (data parallel, allreduce)
    shards: int = 4  #: parameter-server shards K
    workers: int = 4  #: workers N
    consistency: str = "bsp"  #: bsp, ssp (sim: bounded staleness) or async (ray)
    staleness: int = 2  #: SSP bound s (ignored under bsp)
    ranks: int = 4  #: dp: data-parallel ranks N (each holds a full replica)
    elastic: str = "keep-global"  #: dp: keep-global (larger per-rank batch) or keep-local
    allreduce_buckets: int = 4  #: dp: gradient buckets per allreduce (failures hit between them)
    replace: bool = True  #: dp: failed ranks are replaced after cost.replace_seconds
    failures: list[str] = field(default_factory=list)  #: failure specs
    seed: int = 0  #: one seed for everything random in the run
    max_iterations: int | None = None  #: stop after this many executed iterations
    eval_every: int | None = None  #: evaluate every this many iterations
    target: float | None = None  #: convergence target (default: the workload's)
    stop_at_target: bool = True  #: end the run when the target is reached
    past_target: float = 0.0  #: ...after this many more iterations, as a fraction
    checkpoint_every: int | None = None  #: N, iterations between full checkpoints
    checkpoint_keep: int = 3  #: full checkpoints kept
    #: r, prioritized: fraction saved every r*N iterations (``None``: 1/N, the bytes of
    #: a full checkpoint spread over every iteration)
    checkpoint_fraction: float | None = 0.25
    checkpoint_rule: str = "largest-change"  #: prioritized: largest-change, random, round-robin
    checkpoint_dir: str | None = None  #: path or fsspec URL (default: <out>/checkpoints)
    lr: float | None = None  #: override the workload's server step size
    baseline: bool = False  #: also run failure-free with the same seed for rework cost
    workload_options: dict[str, Any] = field(default_factory=dict)  #: passed to the workload
    # -- real engines (ray) ---------------------------------------------------------
    ray_address: str | None = None  #: join this Ray cluster instead of starting one
    recovery_delay: float = 0.0  #: seconds a lost shard, worker or (dist) rank stays down
    replicas: int = 3  #: chain length R per shard (chain strategies)
    max_lag: int = 64  #: chain-async: pushes the head may run ahead of its successor
    coordinator: str = "ray"  #: ray (named actor) or zookeeper
    zookeeper_hosts: str | None = None  #: host:port of ZooKeeper (coordinator=zookeeper)
    merge_rule: str = "mean"  #: stateless backlog: sum, mean, scaled (paper), staleness
    merge_threshold: int = 50  #: stateless 'scaled': backlog size that keeps full steps
    backlog: int = 256  #: stateless: buffered updates per shard before merging oldest
    wall_limit: float | None = None  #: real engines: stop after this many seconds
    cost: CostModel = field(default_factory=CostModel)

    def validate(self) -> None:
        """Check every field.

        Raises:
            UserError: naming the field and what to change.
        """
        from trainthrough.faults.spec import parse
        from trainthrough.ft.strategy import resolve
        from trainthrough.workloads import WORKLOADS

        if self.workload not in WORKLOADS:
            raise UserError(f"unknown workload {self.workload!r}; choose one of: "
                            f"{', '.join(WORKLOADS)}")
        if self.paradigm not in PARADIGMS:
            raise UserError(f"unknown paradigm {self.paradigm!r}; choose one of: "
                            f"{', '.join(PARADIGMS)}")
        resolve(self.strategy).require(self.paradigm)
        if self.engine not in ENGINES:
            raise UserError(f"unknown engine {self.engine!r}; choose one of: {', '.join(ENGINES)}")
        if self.paradigm == "dp" and self.engine not in ("sim", "dist"):
            raise UserError(f"data-parallel runs use the sim or dist engine (got --engine "
                            f"{self.engine})")
        if self.engine == "dist" and self.paradigm != "dp":
            raise UserError("the dist engine runs data-parallel training: add --paradigm dp")
        if self.elastic not in ("keep-global", "keep-local"):
            raise UserError(f"elastic must be keep-global or keep-local (got {self.elastic!r})")
        for name in ("shards", "workers", "checkpoint_keep", "ranks", "allreduce_buckets"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', '-')} must be at least 1 "
                                f"(got {getattr(self, name)})")
        if self.consistency not in ("bsp", "ssp", "async"):
            raise UserError(f"consistency must be bsp, ssp or async (got {self.consistency!r})")
        if self.staleness < 0:
            raise UserError(f"staleness must be 0 or more (got {self.staleness})")
        for name in ("max_iterations", "eval_every", "checkpoint_every"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise UserError(f"{name.replace('_', '-')} must be at least 1 (got {v})")
        if self.checkpoint_fraction is not None and not 0 < self.checkpoint_fraction <= 1:
            raise UserError(f"checkpoint-fraction must be in (0, 1] (got "
                            f"{self.checkpoint_fraction})")
        if self.checkpoint_rule not in ("largest-change", "random", "round-robin"):
            raise UserError(f"checkpoint-rule must be largest-change, random or round-robin "
                            f"(got {self.checkpoint_rule!r})")
        if self.lr is not None and not self.lr > 0:
            raise UserError(f"lr must be positive (got {self.lr})")
        for f in fields(CostModel):
            if getattr(self.cost, f.name) < 0:
                raise UserError(f"cost.{f.name} must not be negative")
        parse(self.failures)
        strategy = resolve(self.strategy)
        if self.engine not in strategy.engines:
            raise UserError(f"strategy {self.strategy} runs on the "
                            f"{' or '.join(strategy.engines)} engine, not {self.engine}")
        if self.engine == "ray":
            if self.consistency == "ssp":
                raise UserError("the ray engine runs bsp rounds or async workers; use "
                                "--consistency bsp or async")
            if (strategy.replication != "none" or strategy.outage != "wait") \
                    and self.consistency == "bsp":
                raise UserError(f"strategy {self.strategy} needs asynchronous workers: "
                                "use --consistency async")
        elif self.consistency == "async":
            raise UserError("consistency async is for the ray engine; the sim engine runs "
                            "bsp or ssp")
        if self.replicas < 1 or self.max_lag < 1 or self.backlog < 2:
            raise UserError("replicas and max-lag must be at least 1, backlog at least 2")
        if self.recovery_delay < 0:
            raise UserError(f"recovery-delay must not be negative (got {self.recovery_delay})")
        if self.coordinator not in ("ray", "zookeeper"):
            raise UserError(f"coordinator must be ray or zookeeper (got {self.coordinator!r})")
        if self.coordinator == "zookeeper" and not self.zookeeper_hosts:
            raise UserError("coordinator zookeeper needs --zookeeper-hosts host:port")
        if self.merge_rule not in ("sum", "mean", "scaled", "staleness"):
            raise UserError(f"merge-rule must be sum, mean, scaled or staleness "
                            f"(got {self.merge_rule!r})")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, ``None`` fields left out (TOML has no null)."""
        return _drop_none(asdict(self))

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from a dict (e.g. parsed TOML).

        Raises:
            UserError: unknown keys, naming them.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"config: unknown key(s) {', '.join(unknown)}; known keys: "
                            f"{', '.join(sorted(known))}")
        data = dict(data)
        cost = data.pop("cost", {}) or {}
        cost_known = {f.name for f in fields(CostModel)}
        bad = sorted(set(cost) - cost_known)
        if bad:
            raise UserError(f"config: unknown cost key(s) {', '.join(bad)}")
        if isinstance(data.get("failures"), str):
            data["failures"] = [data["failures"]]
        return cls(cost=CostModel(**cost), **data)

    @classmethod
    def from_toml(cls, path: str | Path) -> RunConfig:
        """Read a config file.

        Raises:
            UserError: missing or malformed file.
        """
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file {p} does not exist")
        try:
            return cls.from_dict(tomllib.loads(p.read_text()))
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"config file {p} is not valid TOML: {e}") from None
        except TypeError as e:
            raise UserError(f"config file {p}: {e}") from None


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_drop_none(v) if isinstance(v, dict) else v)
            for k, v in d.items() if v is not None}
