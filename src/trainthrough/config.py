"""The run configuration: typed, validated early, written back as ``config.toml``.

Every field is documented here, and every error names the field to change. A run
folder's ``config.toml`` is the fully resolved config and can be re-run as is
(``trainthrough run --config runs/X/config.toml``).

Validation happens in one place: each field's type comes from its annotation and
its accepted values from the :class:`Bounds` next to its default, and
:func:`check_fields` checks every field against both (from a TOML file, the command
line, or code alike). :meth:`RunConfig.validate` adds only the rules that relate
fields to each other.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import tomli_w

from trainthrough.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Engine names (aliases included) for the field's choices; what each engine runs is
# declared by the engine itself (engines/registry.py), never here.
ENGINES = ("sim", "ray", "gloo", "dist")
PARADIGMS = {"ps": "parameter server: K shards own the parameters, N workers push updates",
             "dp": "data parallel: N ranks each hold a replica and allreduce gradients"}
#: Seeds end up in numpy's legacy RandomState (32 bits) and, multiplied, in torch
#: generators (64 bits); 32 bits keep every derived seed in range.
SEED_MAX = 2**32 - 1
_INT64_MAX = 2**63 - 1
# Numbers as text, ASCII only: int() and float() also take "١", " 1 " and "1_0", which
# nobody types on purpose. nan and inf parse, so that validation can name the field.
INT_TEXT = re.compile(r"[+-]?[0-9]+")
FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                        r"|[+-]?(?:inf|nan)", re.IGNORECASE)
#: Fields ``trainthrough run`` sets with a flag of the same name (``--max-iterations``);
#: ``failures`` is ``--fail`` and ``workload_options`` is ``--option``.
FLAG_FIELDS = (
    "workload", "strategy", "engine", "paradigm", "ranks", "elastic", "shards", "workers",
    "consistency", "staleness", "seed", "checkpoint_every", "checkpoint_keep", "checkpoint_dir",
    "checkpoint_fraction", "checkpoint_rule", "max_iterations", "eval_every", "target", "lr",
    "baseline", "ray_address", "keep_warm", "recovery_delay", "replicas", "coordinator", "zookeeper_hosts",
    "merge_rule", "merge_threshold", "wall_limit", "allreduce_buckets", "micro_batches")


@dataclass(frozen=True)
class Bounds:
    """The values a number or a name accepts beyond its type."""

    ge: float | None = None  #: at least
    gt: float | None = None  #: strictly above
    le: float | None = None  #: at most
    choices: tuple[str, ...] = ()

    def accepts(self, v: Any) -> bool:
        if self.choices:
            return v in self.choices
        return ((self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le))

    def describe(self) -> str:
        if self.choices:
            return f"one of: {', '.join(self.choices)}"
        if self.ge is not None and self.le is not None:
            return f"from {_num(self.ge)} to {_num(self.le)}"
        lo = (f"at least {_num(self.ge)}" if self.ge not in (None, 0) else
              "0 or more" if self.ge == 0 else
              "positive" if self.gt == 0 else f"above {_num(self.gt)}" if self.gt is not None
              else "")
        hi = f"at most {_num(self.le)}" if self.le is not None else ""
        return " and ".join(p for p in (lo, hi) if p)


def _num(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def _f(default: Any = None, *, factory: Callable[[], Any] | None = None, **bounds: Any) -> Any:
    """A dataclass field with :class:`Bounds` (``ge``, ``gt``, ``le``, ``choices``)."""
    meta = {"bounds": Bounds(**bounds)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_value(label: str, value: Any, hint: Any, bounds: Bounds | None = None) -> None:
    """Check one value against a type hint (``int``, ``float``, ``X | None``, ...) and bounds.

    ``bool`` is not an ``int`` here, and a ``float`` must be finite: TOML's ``true``,
    ``nan`` and ``inf`` are never meant as a count or a step size.

    Raises:
        UserError: ``"<label> must be <what> (got <value>)"``.
    """
    if get_origin(hint) in (Union, UnionType):
        if value is None and type(None) in get_args(hint):
            return
        hint = next(a for a in get_args(hint) if a is not type(None))
    origin = get_origin(hint) or hint
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint is Any:
        return
    if hint is bool:
        ok, want = isinstance(value, bool), "true or false"
    elif hint is int:
        ok, want = is_number and isinstance(value, int), "a whole number"
    elif hint is float:
        ok, want = is_number and math.isfinite(value), "a finite number"
    elif hint is str:
        ok, want = isinstance(value, str), "text (a quoted string)"
    elif origin is list:
        ok, want = isinstance(value, list), "a list"
    elif origin is dict:
        ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
        want = "a table of key = value"
    elif isinstance(origin, type):
        ok, want = isinstance(value, origin), f"a {origin.__name__} table"
    else:  # Literal, Callable[...] and the like: the factory itself checks them
        return
    if not ok:
        raise UserError(f"{label} must be {want} (got {_show(value)})")
    if origin is list:
        for i, item in enumerate(value):
            check_value(f"{label}[{i}]", item, get_args(hint)[0])
    if bounds is not None and not bounds.accepts(value):
        raise UserError(f"{label} must be {bounds.describe()} (got {_show(value)})")
    if hint is int and abs(value) > _INT64_MAX:  # what torch and numpy can hold
        raise UserError(f"{label} must be at most {_INT64_MAX} (got {_show(value)})")


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


def check_fields(obj: Any, label: Callable[[str], str] = str, prefix: str = "") -> None:
    """Check every field of a config dataclass against its type and :class:`Bounds`.

    Raises:
        UserError: for the first field that is wrong, named by ``label(key)``.
    """
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        value, name = getattr(obj, f.name), prefix + f.name
        check_value(label(name), value, hints[f.name], f.metadata.get("bounds"))
        if is_dataclass(value):
            check_fields(value, label, name + ".")


@dataclass
class CostModel:
    """What the ``sim`` engine charges to its virtual clock (seconds, bytes/s)."""

    compute_scale: float = _f(1.0, ge=0)  #: multiplies the workload's per-step compute time
    network_bandwidth: float = _f(1.25e9, gt=0)  #: bytes/s per server link (10 Gb/s)
    network_latency: float = _f(0.0005, ge=0)  #: seconds per request
    storage_bandwidth: float = _f(2.0e8, gt=0)  #: bytes/s to checkpoint storage (200 MB/s)
    memory_bandwidth: float = _f(5.0e9, gt=0)  #: bytes/s for in-memory snapshots (async persist)
    detection_seconds: float = _f(1.0, ge=0)  #: failure to detection
    restart_seconds: float = _f(5.0, ge=0)  #: detection to a replacement being up
    #: dp: survivors build a new group (rendezvous, communicator)
    reform_seconds: float = _f(0.5, ge=0)
    #: dp: failure to a replacement rank joining the running group
    replace_seconds: float = _f(5.0, ge=0)
    #: dp: collective timeout, how long a hung rank goes unnoticed
    timeout_seconds: float = _f(10.0, ge=0)


@dataclass
class RunConfig:
    """Everything a run needs. Defaults marked None resolve from the workload."""

    workload: str = "mlr"  #: workload name (``trainthrough list``)
    strategy: str = "checkpoint-restart"  #: preset or composition
    engine: str = _f("sim", choices=ENGINES)  #: sim, ray or gloo (alias dist)
    #: ps (parameter server) or dp (data parallel, allreduce)
    paradigm: str = _f("ps", choices=tuple(PARADIGMS))
    shards: int = _f(4, ge=1)  #: parameter-server shards K
    workers: int = _f(4, ge=1)  #: workers N
    #: bsp, ssp (sim: bounded staleness) or async (ray)
    consistency: str = _f("bsp", choices=("bsp", "ssp", "async"))
    staleness: int = _f(2, ge=0)  #: SSP bound s (ignored under bsp)
    ranks: int = _f(4, ge=1)  #: dp: data-parallel ranks N (each holds a full replica)
    #: dp: keep-global (larger per-rank batch) or keep-local
    elastic: str = _f("keep-global", choices=("keep-global", "keep-local"))
    #: dp: gradient buckets, one allreduce each (allreduce:K failures hit between
    #: them); the last carries the commit vote
    allreduce_buckets: int = _f(1, ge=1)
    #: dp: micro-batches per rank at the nominal batch, one gradient call each (more
    #: spread a lost rank's share more evenly over the survivors: 4 over 3 ranks
    #: run 2/1/1, 16 run 6/5/5)
    micro_batches: int = _f(1, ge=1)
    replace: bool = True  #: dp: failed ranks are replaced after cost.replace_seconds
    failures: list[str] = field(default_factory=list)  #: failure specs
    seed: int = _f(0, ge=0, le=SEED_MAX)  #: one seed for everything random in the run
    max_iterations: int | None = _f(ge=1)  #: stop after this many executed iterations
    #: evaluate every this many iterations (iterations to target stay exact to one
    #: iteration: engines/evaluation.py)
    eval_every: int | None = _f(ge=1)
    target: float | None = None  #: convergence target (default: the workload's)
    stop_at_target: bool = True  #: end the run when the target is reached
    past_target: float = _f(0.0, ge=0)  #: ...after this many more iterations, as a fraction
    checkpoint_every: int | None = _f(ge=1)  #: N, iterations between full checkpoints
    checkpoint_keep: int = _f(3, ge=1)  #: full checkpoints kept
    #: r, prioritized: fraction saved every r*N iterations (``None``: 1/N, the bytes of
    #: a full checkpoint spread over every iteration)
    checkpoint_fraction: float | None = _f(0.25, gt=0, le=1)
    #: prioritized: largest-change, random, round-robin
    checkpoint_rule: str = _f("largest-change",
                              choices=("largest-change", "random", "round-robin"))
    checkpoint_dir: str | None = None  #: path or fsspec URL (default: <out>/checkpoints)
    lr: float | None = _f(gt=0)  #: override the workload's server step size
    baseline: bool = False  #: also run failure-free with the same seed for rework cost
    #: passed to the workload (checked against its signature: workloads/options.py)
    workload_options: dict[str, Any] = field(default_factory=dict)
    # -- real engines (ray) ---------------------------------------------------------
    ray_address: str | None = None  #: join this Ray cluster instead of starting one
    #: with ray_address: leave this run's clean actors on the cluster, warm, for later
    #: runs, each ended after this many idle seconds (``trainthrough release`` ends them)
    keep_warm: float | None = _f(gt=0)
    #: seconds a lost shard, worker or (dist) rank stays down
    recovery_delay: float = _f(0.0, ge=0)
    replicas: int = _f(3, ge=1)  #: chain length R per shard (chain strategies)
    max_lag: int = _f(64, ge=1)  #: chain-async: pushes the head may run ahead of its successor
    coordinator: str = _f("ray", choices=("ray", "zookeeper"))  #: ray (named actor) or zookeeper
    zookeeper_hosts: str | None = None  #: host:port of ZooKeeper (coordinator=zookeeper)
    #: stateless backlog: sum, mean, scaled (paper), staleness
    merge_rule: str = _f("mean", choices=("sum", "mean", "scaled", "staleness"))
    merge_threshold: int = _f(50, ge=1)  #: stateless 'scaled': backlog size that keeps full steps
    backlog: int = _f(256, ge=2)  #: stateless: buffered updates per shard before merging oldest
    wall_limit: float | None = _f(gt=0)  #: real engines: stop after this many seconds
    cost: CostModel = field(default_factory=CostModel)

    def validate(self) -> None:
        """Check every field, then the rules between fields.

        Raises:
            UserError: naming the field (as its command-line flag) and what to change.
        """
        from trainthrough.engines.registry import check_settings, check_supported
        from trainthrough.faults.spec import parse
        from trainthrough.ft.strategy import resolve
        from trainthrough.workloads import workload_factory
        from trainthrough.workloads.options import check_options

        check_fields(self, flag_label)
        from trainthrough.workloads.user_loop import TrainingLoop

        factory = workload_factory(self.workload)  # unknown names, broken references: one line
        if isinstance(factory, TrainingLoop):  # a user's loop: only ranks that run it
            if self.paradigm != "dp" or self.engine not in ("ray", "gloo", "dist"):
                raise UserError(f"{self.workload} is your own training loop: run it with "
                                "--paradigm dp --engine ray (or gloo)")
        else:
            check_options(self.workload, self.workload_options)
        strategy = resolve(self.strategy)
        strategy.require(self.paradigm)
        specs = parse(self.failures)
        # The chosen engine says what it runs; everything else is refused here.
        check_supported(self.engine, self.paradigm, self.consistency, strategy, specs)
        # A setting the run would not read is refused, never dropped (engines/options.py).
        check_settings(self.engine, self.paradigm, self.consistency, strategy,
                       self.changed_fields())
        if self.zookeeper_hosts and self.coordinator != "zookeeper":
            raise UserError("--zookeeper-hosts is only used with --coordinator zookeeper: "
                            "add it, or drop --zookeeper-hosts")
        if self.keep_warm is not None and (self.engine != "ray" or self.paradigm != "ps"
                                           or not self.ray_address):
            raise UserError("--keep-warm keeps parameter-server actors on a Ray cluster that "
                            "outlives the run: it needs --engine ray --ray-address ADDR "
                            "(and --paradigm ps)")
        if self.coordinator == "zookeeper" and not self.zookeeper_hosts:
            raise UserError("coordinator zookeeper needs --zookeeper-hosts host:port")
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
                            f"got {_show(cost)}")
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


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_drop_none(v) if isinstance(v, dict) else v)
            for k, v in d.items() if v is not None}
