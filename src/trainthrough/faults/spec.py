"""The failure spec language: what fails, and when.

    spec     := target "@" trigger ("," option)*
    target   := kind "=" selector
    kind     := shard | shards | worker | workers | rank | ranks | replica | replicas
    selector := id ("," id)* | "N%" | "any" | "all"
    trigger  := "iter=" INT | "time=" NUM ["s"|"ms"|"min"] | "mtbf=" NUM ("s"|"ms"|"min"|"iter")
    option   := "phase=" PHASE | "mode=" MODE | "max=" INT | "replica=" INT
    MODE     := "crash" | "hang" | "pause:" NUM ("s"|"ms"|"min") | "slow:" NUM "x"
              | "preempt:" NUM ("s"|"ms"|"min") | "partition:" NUM ("s"|"ms"|"min")

INT and NUM are ASCII digits (NUM with an optional ".fraction"); ``max=`` (1 to
:data:`MAX_COUNT`, default 1000) only goes with ``mtbf=``; each option at most once.

Examples: ``shards=1@iter=300``, ``shards=50%@iter=300``, ``worker=2@iter=100``,
``shards=0@time=40s``, ``shard=any@mtbf=120s,max=3``, ``rank=1@iter=40,mode=preempt:10s`` (a notice:
SIGTERM, then SIGKILL 10 s later if the rank has not left),
``rank=1@iter=50,phase=allreduce:2``, ``shards=1@iter=230,phase=recovery`` (strikes
while the recovery of an earlier failure is still in progress).

Modes: ``crash`` (SIGKILL), ``hang`` (stopped for good), ``pause:5s`` (stopped, then
continued after 5 s: a VM migrated, a long GC), ``slow:4x`` (from the trigger on,
every step takes 4 times its compute: the rank sleeps 3 times what it computed),
``partition:8s`` (the ranks named are cut off from the controller's side for 8 s, all
alive: ``ranks=1,2@iter=40,mode=partition:8s``; the rest, and the controller, are the
other side).

Several specs are joined with ``;`` or given as repeated ``--fail`` options.
Parsing never looks at the run: ids are checked against sizes by :func:`validate`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from trainthrough.errors import UserError

Kind = Literal["shard", "worker", "rank", "replica"]
_KINDS: dict[str, Kind] = {"shard": "shard", "shards": "shard", "worker": "worker",
                           "workers": "worker", "rank": "rank", "ranks": "rank",
                           "replica": "replica", "replicas": "replica"}
# ASCII digits only ([0-9], not \d or str.isdigit(): those take "²" and "٣", which int()
# then refuses or reads as another number).
_PHASE = re.compile(r"(forward|backward|update|inner|outer|recovery|persist|allreduce:[0-9]+)")
_INT = re.compile(r"[0-9]+")
_TIME = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|min)?")
_MTBF = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|min|iter)")
_AWAY = re.compile(r"(pause|partition):([0-9]+(?:\.[0-9]+)?)(ms|s|min)")
_SLOW = re.compile(r"slow:([0-9]+(?:\.[0-9]+)?)x")
#: The longest pause a spec may ask for, and the largest slow-down (a longer pause is a
#: hang; a larger factor starves the run of steps, not of what the test is about).
MAX_PAUSE_SECONDS = 3600.0
MAX_SLOW_FACTOR = 1000.0
_FRACTION = re.compile(r"[0-9]+(?:\.[0-9]+)?%")
_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, None: 1.0}
#: Most failures one random spec may deliver (``max=``). Each is a recovery the engine
#: carries out and a line in events.jsonl; far more than any run can make sense of.
MAX_COUNT = 100_000
#: Longest preemption notice (``mode=preempt:``) a spec may give: clouds give 30 s to
#: 2 minutes; an hour is far past any.
MAX_NOTICE = 3600.0
#: Largest iteration, id or chain position a spec may name (fits every engine's int64).
_MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class FailureSpec:
    """One parsed failure spec. Exactly one of ``at_iter``, ``at_time``, ``mtbf`` is set."""

    kind: Kind
    ids: tuple[int, ...] = ()
    fraction: float | None = None
    any_one: bool = False
    every: bool = False
    at_iter: int | None = None
    at_time: float | None = None
    mtbf: float | None = None
    mtbf_unit: Literal["s", "iter"] = "s"
    phase: str | None = None
    mode: Literal["crash", "hang", "pause", "slow", "preempt", "partition"] = "crash"
    pause_seconds: float | None = None  # mode=pause: how long the rank stays stopped
    cut_seconds: float | None = None  # mode=partition: how long the ranks are cut off
    slow_factor: float | None = None  # mode=slow: a step takes this many times its compute
    notice: float | None = None  # mode=preempt: seconds from the notice to the SIGKILL
    max_count: int | None = None
    replica: int | None = None
    text: str = ""


def _bad(text: str, why: str) -> UserError:
    return UserError(f"failure spec {text!r}: {why} (e.g. 'shards=1@iter=300', "
                     f"'shards=50%@iter=300', 'worker=2@time=40s', 'shard=any@mtbf=120s')")


def _whole(raw: str, what: str, text: str) -> int:
    if not _INT.fullmatch(text):
        raise _bad(raw, f"{what} must be a whole number in digits 0-9 (got {text!r})")
    if int(text) > _MAX_INT:
        raise _bad(raw, f"{what} {text} is too large (at most {_MAX_INT})")
    return int(text)


def _selector(raw: str, sel: str) -> dict[str, object]:
    if sel == "any":
        return {"any_one": True}
    if sel == "all":
        return {"every": True}
    if sel.endswith("%"):
        frac = float(sel[:-1]) / 100.0 if _FRACTION.fullmatch(sel) else -1.0
        if not 0 < frac <= 1:
            raise _bad(raw, f"fraction {sel!r} must be above 0% and at most 100%")
        return {"fraction": frac}
    items = [s.strip() for s in sel.split(",")]
    if not all(_INT.fullmatch(s) for s in items):
        raise _bad(raw, f"bad selector {sel!r}: use ids like 0,2 or N% or any or all")
    ids = tuple(_whole(raw, "an id", s) for s in items)
    if len(set(ids)) != len(ids):
        raise _bad(raw, f"ids must be distinct (got {sel})")
    return {"ids": ids}


def _trigger(raw: str, when: str) -> dict[str, object]:
    key, eq, val = when.partition("=")
    if not eq:
        raise _bad(raw, "when must be iter=N, time=T or mtbf=T")
    if key == "iter":
        return {"at_iter": _whole(raw, "iteration", val)}
    if key == "time":
        m = _TIME.fullmatch(val)
        seconds = float(m.group(1)) * _UNITS[m.group(2)] if m else math.inf
        if not math.isfinite(seconds):
            raise _bad(raw, f"time must look like 40s, 500ms or 2min (got {val!r})")
        return {"at_time": seconds}
    if key == "mtbf":
        m = _MTBF.fullmatch(val)
        mean = float(m.group(1)) if m else 0.0
        if not 0 < mean < math.inf:
            raise _bad(raw, f"mtbf must be positive with a unit, like 120s or 300iter "
                            f"(got {val!r})")
        unit = m.group(2) if m else "s"
        return {"mtbf": mean * (1.0 if unit == "iter" else _UNITS[unit]),
                "mtbf_unit": "iter" if unit == "iter" else "s"}
    raise _bad(raw, f"unknown trigger {key!r}; use iter=, time= or mtbf=")


def _option(raw: str, opt: str, fields: dict[str, object]) -> None:
    k, eq, v = opt.partition("=")
    if not eq:
        raise _bad(raw, f"option {opt!r} must be key=value")
    name = {"phase": "phase", "mode": "mode", "max": "max_count", "replica": "replica"}.get(k)
    if name is None:
        raise _bad(raw, f"unknown option {k!r}; use phase=, mode=, max= or replica=")
    if name in fields:
        raise _bad(raw, f"option {k}= is given twice")
    if k == "phase":
        if not _PHASE.fullmatch(v):
            raise _bad(raw, f"unknown phase {v!r}; use forward, backward, allreduce:K, "
                            "update, inner, outer, persist or recovery")
        fields[name] = v
    elif k == "mode":
        fields.update(_mode(raw, v))
    elif k == "max":
        if "mtbf" not in fields:
            raise _bad(raw, "max= limits random failures: it needs an mtbf= trigger")
        if not _INT.fullmatch(v) or not 1 <= int(v) <= MAX_COUNT:
            raise _bad(raw, f"max must be a whole number from 1 to {MAX_COUNT} (got {v!r})")
        fields[name] = int(v)
    else:
        fields[name] = _whole(raw, k, v)


def _mode(raw: str, v: str) -> dict[str, object]:
    """``mode=``'s value as FailureSpec fields (a pause's seconds, a slow-down's factor,
    a preemption's notice)."""
    if v in ("crash", "hang"):
        return {"mode": v}
    if v.startswith("preempt:"):
        return {"mode": "preempt", "notice": _notice(raw, v[len("preempt:"):])}
    if (m := _AWAY.fullmatch(v)) is not None:
        what, seconds = m.group(1), float(m.group(2)) * _UNITS[m.group(3)]
        if not 0 < seconds <= MAX_PAUSE_SECONDS:
            hang = "; a rank stopped for good is mode=hang" if what == "pause" else ""
            raise _bad(raw, f"a {what} lasts more than 0 s and at most "
                            f"{MAX_PAUSE_SECONDS:g} s (got {v!r}{hang})")
        if what == "partition":
            return {"mode": "partition", "cut_seconds": seconds}
        return {"mode": "pause", "pause_seconds": seconds}
    if (m := _SLOW.fullmatch(v)) is not None:
        factor = float(m.group(1))
        if not 1 < factor <= MAX_SLOW_FACTOR:
            raise _bad(raw, f"a slow-down is a factor above 1 and at most {MAX_SLOW_FACTOR:g} "
                            f"(got {v!r})")
        return {"mode": "slow", "slow_factor": factor}
    raise _bad(raw, f"mode must be crash, hang, pause:DURATION (pause:5s), slow:FACTORx "
                    f"(slow:4x), preempt:NOTICE (preempt:10s) or partition:DURATION "
                    f"(partition:8s) (got {v!r})")


def _notice(raw: str, val: str) -> float:
    """The notice of ``mode=preempt:<notice>``: positive, with a unit, at most
    :data:`MAX_NOTICE` seconds."""
    m = _MTBF.fullmatch(val)
    seconds = float(m.group(1)) * _UNITS[m.group(2)] if m and m.group(2) != "iter" else 0.0
    if not 0 < seconds <= MAX_NOTICE:
        raise _bad(raw, f"mode=preempt:<notice> needs a notice above 0 and at most "
                        f"{MAX_NOTICE:g} s with a unit, like preempt:10s or preempt:2min "
                        f"(got {val!r})")
    return seconds


def parse_one(text: str) -> FailureSpec:
    """Parse one spec.

    Raises:
        UserError: naming what is malformed.
    """
    raw = text.strip()
    if raw.count("@") != 1:
        raise _bad(raw, "needs exactly one '@' between what fails and when")
    target, trigger = raw.split("@")
    if "=" not in target:
        raise _bad(raw, "what fails must look like kind=selector")
    kind_s, sel = (s.strip() for s in target.split("=", 1))
    if kind_s not in _KINDS:
        raise _bad(raw, f"unknown kind {kind_s!r}; use shards, workers, ranks or replicas")
    fields: dict[str, object] = {"kind": _KINDS[kind_s], "text": raw, **_selector(raw, sel)}
    when, *opts = (p.strip() for p in trigger.split(","))
    fields.update(_trigger(raw, when))
    for opt in opts:
        _option(raw, opt, fields)
    return FailureSpec(**fields)  # type: ignore[arg-type]


def parse(texts: str | list[str] | tuple[str, ...] | None) -> list[FailureSpec]:
    """Parse specs given as one ``;``-separated string or a list of them."""
    if not texts:
        return []
    items = [texts] if isinstance(texts, str) else list(texts)
    out = []
    for item in items:
        for piece in str(item).split(";"):
            if piece.strip():
                out.append(parse_one(piece))
    return out


def check_together(specs: list[FailureSpec]) -> None:
    """The rules between the specs of one run (each one parsed already).

    A ``phase=recovery`` failure waits for a recovery in progress
    (:meth:`~trainthrough.faults.schedule.FailureSchedule.due`): with no other failure
    spec in the run, nothing is ever recovered, so it would never strike and the run
    would end as if it had not been asked for.

    Raises:
        UserError: one line naming the spec and what to add.
    """
    causes = [s for s in specs if s.phase != "recovery"]
    for s in specs:
        if s.phase == "recovery" and not causes:
            raise UserError(f"failure spec {s.text!r}: phase=recovery strikes only while "
                            "another failure is being recovered, and no other failure spec "
                            f"causes one: add one (e.g. '{s.kind}=0@iter={s.at_iter or 1}') "
                            "or drop phase=recovery")


def picked(s: FailureSpec, n: int) -> int:
    """How many of ``n`` components ``s`` strikes at once (the schedule picks which)."""
    if s.every:
        return n
    if s.ids:
        return len(s.ids)
    if s.fraction is not None:
        return min(n, max(1, int(round(s.fraction * n))))
    return 1  # any


def validate(specs: list[FailureSpec], sizes: dict[str, int]) -> None:
    """Check ids against the run's sizes (``{"shard": K, "worker": N, ...}``).

    Raises:
        UserError: an id out of range, a kind the run does not have.
    """
    for s in specs:
        n = sizes.get(s.kind)
        if n is None:
            raise UserError(f"failure spec {s.text!r}: this run has no {s.kind}s "
                            f"(it has {', '.join(k + 's' for k in sizes)})")
        if s.ids and max(s.ids) >= n:
            raise UserError(f"failure spec {s.text!r}: {s.kind} {max(s.ids)} does not exist; "
                            f"ids go from 0 to {n - 1}")
        if len(s.ids) > n:
            raise UserError(f"failure spec {s.text!r}: loses {len(s.ids)} {s.kind}s of {n}")
        if s.mode == "partition" and picked(s, n) >= n:
            # Every rank cut off from the controller: no side can go on (a job stop).
            raise UserError(f"failure spec {s.text!r}: a partition cuts some {s.kind}s off "
                            f"from the controller's side; all {n} leaves no side to go on")
        chain = sizes.get("replica", 1)
        if s.replica is not None and s.replica >= chain:
            raise UserError(f"failure spec {s.text!r}: replica={s.replica} names a chain "
                            f"position, but chains here have {chain} replica"
                            f"{'s' if chain > 1 else ''} (positions 0 to {chain - 1})")
