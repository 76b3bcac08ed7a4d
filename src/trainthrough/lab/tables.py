"""A suite summary (:func:`trainthrough.lab.results.summarize`) as tables: fixed-width
text for the terminal, markdown for the report.

Columns: the group keys, runs, converged runs, mean rework (± sd, or its 95% interval
when the summary has one), the reduction against the baseline, then the mean costs
that some group has a value for (the terminal table shows only recovery, sim and wall
seconds of them). A missing value reads ``n/a``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainthrough.lab.results import STAT_FIELDS, finite

_NA = "n/a"

_OPTIONAL = (("rework_bound", "bound"), ("perturbation_norm", "‖δ‖"),
             ("recovery_seconds", "recovery s"), ("checkpoint_bytes", "ckpt MB"),
             ("checkpoint_blocked_seconds", "blocked s"), ("updates_lost", "updates lost"),
             ("sim_seconds", "sim s"), ("wall_seconds", "wall s"))


def _number(v: Any, scale: float = 1.0) -> str:
    """A number to about three significant digits (thousands grouped), or ``n/a``."""
    x = finite(v)
    if x is None:
        return _NA
    x *= scale
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _label(v: Any) -> str:
    return "none" if v is None or v == "" else str(v)


def _rework(s: dict[str, Any]) -> str:
    if s.get("rework_mean") is None:
        return _NA
    if "rework_lo" in s:  # summarized with intervals
        return f"{s['rework_mean']:.1f} " + _bounds(s["rework_lo"], s["rework_hi"], 1.0, "")
    sd = s.get("rework_sd")
    return f"{s['rework_mean']:.1f}" + ("" if sd is None else f" ± {sd:.1f}")


def _bounds(lo: float | None, hi: float | None, scale: float, unit: str) -> str:
    if lo is None or hi is None:
        return "[unbounded]"
    return f"[{scale * lo:.1f}, {scale * hi:.1f}{unit}]"


def _reduction(s: dict[str, Any], baseline: str) -> str:
    if s.get("strategy") == baseline:
        return "baseline"
    r = s.get("reduction_vs_baseline")
    if r is None:
        return _NA
    if "reduction_lo" in s:
        lo, hi = s["reduction_lo"], s["reduction_hi"]
        if lo is None or hi is None or lo <= 0 <= hi:
            # The interval reaches 0: a percentage here would be read as a saving.
            return "no difference measured " + _bounds(lo, hi, 100.0, "%")
        return f"{100 * r:.1f}% " + _bounds(lo, hi, 100.0, "%")
    return f"{100 * r:.1f}%"


def _header(key: str) -> str:
    return "failures" if key == "fail" else key.replace("_", " ")


#: a column a suite adds after the reduction: its header and its text for a summary row
#: (e.g. a published figure beside ours)
Column = tuple[str, Callable[[dict[str, Any]], str]]


def _columns(rows: Sequence[dict[str, Any]], baseline: str, full: bool,
             extra: Sequence[Column] = ()) -> list[tuple[str, str]]:
    """(header, field) pairs; optional columns only when some group has a value;
    ``extra`` columns (field ``extra:<i>``) right after the reduction."""
    keys = [k for k in (rows[0] if rows else {}) if k not in STAT_FIELDS]
    cols = [(_header(k), k) for k in keys]
    ci = bool(rows) and "rework_lo" in rows[0]
    cols += [("runs", "n"), ("converged", "converged"),
             ("rework (mean [95% CI])" if ci else "rework (mean ± sd)", "rework_mean"),
             (f"reduction vs {baseline}" + (" [95% CI]" if ci else ""),
              "reduction_vs_baseline")]
    cols += [(head, f"extra:{i}") for i, (head, _) in enumerate(extra)]
    brief = {"recovery_seconds", "sim_seconds", "wall_seconds"}
    cols += [(head, f"{c}_mean") for c, head in _OPTIONAL if (full or c in brief)
             and any(s.get(f"{c}_mean") is not None for s in rows)]
    return cols


def _cell(s: dict[str, Any], field: str, baseline: str, extra: Sequence[Column] = ()
          ) -> str:
    if field.startswith("extra:"):
        return extra[int(field[6:])][1](s)
    if field not in STAT_FIELDS:
        return _label(s.get(field))
    if field == "n":  # a count: "10", not _number's "10.0"
        return str(s["n"])
    if field == "converged":
        return f"{s['converged']}/{s['n']}"
    if field == "rework_mean":
        return _rework(s)
    if field == "reduction_vs_baseline":
        return _reduction(s, baseline)
    return _number(s.get(field), 1e-6 if field == "checkpoint_bytes_mean" else 1.0)


def headline_table(summary_rows: Sequence[dict[str, Any]],
                   baseline_strategy: str = "checkpoint-restart",
                   extra: Sequence[Column] = ()) -> str:
    """A fixed-width plain-text table of the summary, for the terminal."""
    cols = _columns(summary_rows, baseline_strategy, full=False, extra=extra)
    cells = [[h for h, _ in cols]] + [[_cell(s, f, baseline_strategy, extra) for _, f in cols]
                                      for s in summary_rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) if f in STAT_FIELDS else c.ljust(w)
                       for c, w, (_, f) in zip(r, widths, cols, strict=True)).rstrip()
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def md_cell(text: str, code: bool = False) -> str:
    """``text`` safe in a markdown table cell; as inline code if ``code`` (and a value)."""
    text = text.replace("|", "\\|")
    return f"`{text}`" if code and text not in ("", "none", _NA) else text


def _md_table(headers: list[str], rows: list[list[str]], right: list[bool]) -> str:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def summary_md(summary: list[dict[str, Any]], baseline: str,
               extra: Sequence[Column] = ()) -> str:
    """The summary as a markdown table, every column with a value (numbers right-aligned)."""
    cols = _columns(summary, baseline, full=True, extra=extra)
    body = [[md_cell(_cell(s, f, baseline, extra), code=f == "fail") for _, f in cols]
            for s in summary]
    return _md_table([h for h, _ in cols], body, [f in STAT_FIELDS for _, f in cols])


def runs_md(rows: list[dict[str, Any]]) -> str:
    """One markdown table row per run of ``results.csv``: its id, keys and outcome."""
    keys = ["run_id", "workload", "fail", "strategy", "seed", "converged",
            "iterations_to_target", "rework_iterations", "failures", "final_metric"]
    body = [[md_cell(_NA if r.get(k) is None else
                     _number(r[k]) if isinstance(r[k], float) else str(r[k]), code=k == "fail")
             for k in keys] for r in rows]
    return _md_table([k.replace("_", " ") for k in keys], body,
                     [k not in ("run_id", "workload", "fail", "strategy") for k in keys])
