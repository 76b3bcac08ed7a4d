"""Typed, bounded fields: what a setting accepts, and the one check of a value against it.

A leaf: it imports nothing of trainthrough but :mod:`trainthrough.errors` (and no
torch), so that the run config (:mod:`trainthrough.config`) and every workload's
options (:mod:`trainthrough.workloads.options`) check values the same way.

- :class:`Bounds`: the values a number or a name accepts beyond its type;
- :func:`bounded`: a dataclass field that carries its :class:`Bounds`;
- :func:`check_value`: one value against a type hint and bounds;
- :func:`check_fields`: every field of a config dataclass against its annotation and
  :class:`Bounds`.

Every refusal is a :class:`~trainthrough.errors.UserError` that reads ``"<label> must
be <what> (got <value>)"``; the caller chooses the label (a flag, a TOML key, a
workload option).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from trainthrough.errors import UserError

#: Seeds end up in numpy's legacy RandomState (32 bits) and, multiplied, in torch
#: generators (64 bits); 32 bits keep every derived seed in range.
SEED_MAX = 2**32 - 1
#: The largest whole number a setting may hold: what torch and numpy can hold.
INT64_MAX = 2**63 - 1
# Numbers as text, ASCII only: int() and float() also take "١", " 1 " and "1_0", which
# nobody types on purpose. nan and inf parse, so that validation can name the field.
INT_TEXT = re.compile(r"[+-]?[0-9]+")
FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                        r"|[+-]?(?:inf|nan)", re.IGNORECASE)


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


def bounded(default: Any = None, *, factory: Callable[[], Any] | None = None,
            **bounds: Any) -> Any:
    """A dataclass field with :class:`Bounds` (``ge``, ``gt``, ``le``, ``choices``),
    kept in its metadata under ``"bounds"`` for :func:`check_fields`."""
    meta = {"bounds": Bounds(**bounds)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def show(v: Any) -> str:
    """A value as an error message quotes it: its repr, cut to 60 characters."""
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
        raise UserError(f"{label} must be {want} (got {show(value)})")
    if origin is list:
        for i, item in enumerate(value):
            check_value(f"{label}[{i}]", item, get_args(hint)[0])
    if bounds is not None and not bounds.accepts(value):
        raise UserError(f"{label} must be {bounds.describe()} (got {show(value)})")
    if hint is int and abs(value) > INT64_MAX:
        raise UserError(f"{label} must be at most {INT64_MAX} (got {show(value)})")


def check_fields(obj: Any, label: Callable[[str], str] = str, prefix: str = "") -> None:
    """Check every field of a config dataclass against its type and :class:`Bounds`
    (nested dataclasses too, their fields named ``outer.inner``).

    Raises:
        UserError: for the first field that is wrong, named by ``label(key)``.
    """
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        value, name = getattr(obj, f.name), prefix + f.name
        check_value(label(name), value, hints[f.name], f.metadata.get("bounds"))
        if is_dataclass(value):
            check_fields(value, label, name + ".")
