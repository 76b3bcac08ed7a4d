"""The failure spec language: what fails, and when.

    spec     := target "@" trigger ("," option)*
    target   := kind "=" selector
    kind     := shard | shards | worker | workers | rank | ranks | replica | replicas
    selector := id ("," id)* | "N%" | "any" | "all"
    trigger  := "iter=" INT | "time=" NUM ["s"|"ms"|"min"] | "mtbf=" NUM ("s"|"iter")
    option   := "phase=" PHASE | "mode=" ("crash"|"hang") | "max=" INT | "replica=" INT

Examples: ``shards=1@iter=300``, ``shards=50%@iter=300``, ``worker=2@iter=100``,
``shards=0@time=40s``, ``shard=any@mtbf=120s,max=3``,
``rank=1@iter=50,phase=allreduce:2``, ``shards=1@iter=230,phase=recovery`` (strikes
while the recovery of an earlier failure is still in progress).

Several specs are joined with ``;`` or given as repeated ``--fail`` options.
Parsing never looks at the run: ids are checked against sizes by :func:`validate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from trainthrough.errors import UserError

Kind = Literal["shard", "worker", "rank", "replica"]
_KINDS: dict[str, Kind] = {"shard": "shard", "shards": "shard", "worker": "worker",
                           "workers": "worker", "rank": "rank", "ranks": "rank",
                           "replica": "replica", "replicas": "replica"}
_PHASE = re.compile(r"^(forward|backward|update|recovery|persist|allreduce:\d+)$")
_TIME = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|min)?$")
_MTBF = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|min|iter)$")
_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, None: 1.0}


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
    mode: Literal["crash", "hang"] = "crash"
    max_count: int | None = None
    replica: int | None = None
    text: str = ""


def _bad(text: str, why: str) -> UserError:
    return UserError(f"failure spec {text!r}: {why} (e.g. 'shards=1@iter=300', "
                     f"'shards=50%@iter=300', 'worker=2@time=40s', 'shard=any@mtbf=120s')")


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
    fields: dict[str, object] = {"kind": _KINDS[kind_s], "text": raw}
    if sel == "any":
        fields["any_one"] = True
    elif sel == "all":
        fields["every"] = True
    elif sel.endswith("%"):
        try:
            frac = float(sel[:-1]) / 100.0
        except ValueError:
            raise _bad(raw, f"bad fraction {sel!r}") from None
        if not 0 < frac <= 1:
            raise _bad(raw, f"fraction {sel} must be above 0% and at most 100%")
        fields["fraction"] = frac
    else:
        try:
            ids = tuple(int(s) for s in sel.split(","))
        except ValueError:
            raise _bad(raw, f"bad selector {sel!r}: use ids like 0,2 or N% or any or all") from None
        if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
            raise _bad(raw, f"ids must be distinct and non-negative (got {sel})")
        fields["ids"] = ids
    parts = [p.strip() for p in trigger.split(",")]
    when, opts = parts[0], parts[1:]
    if "=" not in when:
        raise _bad(raw, "when must be iter=N, time=T or mtbf=T")
    key, val = when.split("=", 1)
    if key == "iter":
        if not val.isdigit():
            raise _bad(raw, f"iteration must be a whole number (got {val!r})")
        fields["at_iter"] = int(val)
    elif key == "time":
        m = _TIME.match(val)
        if not m:
            raise _bad(raw, f"time must look like 40s, 500ms or 2min (got {val!r})")
        fields["at_time"] = float(m.group(1)) * _UNITS[m.group(2)]
    elif key == "mtbf":
        m = _MTBF.match(val)
        if not m or float(m.group(1)) <= 0:
            raise _bad(raw, f"mtbf must be positive with a unit, like 120s or 300iter (got {val!r})")
        unit = m.group(2)
        fields["mtbf"] = float(m.group(1)) * (1.0 if unit == "iter" else _UNITS[unit])
        fields["mtbf_unit"] = "iter" if unit == "iter" else "s"
    else:
        raise _bad(raw, f"unknown trigger {key!r}; use iter=, time= or mtbf=")
    for opt in opts:
        if "=" not in opt:
            raise _bad(raw, f"option {opt!r} must be key=value")
        k, v = opt.split("=", 1)
        if k == "phase":
            if not _PHASE.match(v):
                raise _bad(raw, f"unknown phase {v!r}; use forward, backward, allreduce:K, "
                                "update, persist or recovery")
            fields["phase"] = v
        elif k == "mode":
            if v not in ("crash", "hang"):
                raise _bad(raw, f"mode must be crash or hang (got {v!r})")
            fields["mode"] = v
        elif k in ("max", "replica"):
            if not v.isdigit():
                raise _bad(raw, f"{k} must be a whole number (got {v!r})")
            fields["max_count" if k == "max" else "replica"] = int(v)
        else:
            raise _bad(raw, f"unknown option {k!r}; use phase=, mode=, max= or replica=")
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
