"""What the advisor prints and writes: a table, the reasons, a plot, JSON and markdown.

An advice folder holds ``advice.md``, ``advice.png`` and ``advice.json``; the JSON is
written last, so its presence means the folder is complete. A folder that exists and
is not empty is refused before anything runs: nothing of the user's is overwritten.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainthrough._atomic import atomic_write
from trainthrough.errors import UserError
from trainthrough.lab.advise.advisor import Advice
from trainthrough.lab.advise.model import Prediction

_HEAD = ("rank", "strategy", "interval it (s)", "failure-free overhead",
         "rework it / failure", "lost s / failure", "failures to target",
         "time to target s (+- SE)",
         "overhead", "$ on-demand", "$ spot")


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that exists and is not empty (before calibrating).

    Raises:
        UserError: naming the folder.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not empty; choose another "
                        "folder (advise never writes into a used one)")


def _n(v: float | None, fmt: str = ".3g") -> str:
    if v is None:
        return "n/a"
    return "no progress" if not math.isfinite(v) else format(v, fmt)


def rows(a: Advice) -> list[tuple[str, ...]]:
    """The table's rows, best first, as text."""
    out: list[tuple[str, ...]] = []
    for i, p in enumerate(a.predictions, 1):
        interval = "-" if p.interval is None else f"{p.interval} ({p.interval_seconds:.3g})"
        out.append((str(i), p.label, interval, f"{100 * p.steady:.2f}%", _n(p.rework, ".0f"),
                    _n(p.per_failure_seconds), _n(p.failures, ".1f"),
                    _n(p.seconds_to_target) + _se(p),
                    f"{100 * p.overhead:.0f}%" if math.isfinite(p.overhead) else "no progress",
                    _n(p.cost_on_demand, ".2g"), _n(p.cost_spot, ".2g")))
    return out


def _se(p: Prediction) -> str:
    """`` +- SE`` of the time to target from the calibration's noise, where known."""
    if p.seconds_se is None or not math.isfinite(p.seconds_to_target):
        return ""
    return " +- " + ("no progress" if not math.isfinite(p.seconds_se)
                     else format(p.seconds_se, ".2g"))


def verdict(a: Advice) -> str:
    """One paragraph: the recommendation and why it beats the runner-up."""
    r, u = a.recommended, a.runner_up
    what = "time to target" if a.rank_by == "time" else "on-demand cost to target"
    text = (f"Recommended: {r.name}"
            + (f", checkpoint every {r.interval} iterations" if r.interval else "")
            + f". Least predicted {what} at an MTBF of {a.mtbf:g} {a.clock}: "
            + "; ".join(r.why) + ".")
    if u is not None:
        if math.isfinite(u.seconds_to_target) and math.isfinite(r.seconds_to_target):
            gap = 100 * (u.seconds_to_target / r.seconds_to_target - 1)
            text += f" Runner-up: {u.name}, {gap:.1f}% slower: " + "; ".join(u.why) + "."
            noise = math.hypot(r.seconds_se or 0.0, u.seconds_se or 0.0)
            if a.rank_by == "time" and u.seconds_to_target - r.seconds_to_target < noise:
                text += (f" The two differ by less than the calibration's noise (+- "
                         f"{noise:.2g} s, from the spread of its failure runs): either "
                         "will do; more --calibration-seeds would tell them apart.")
        else:
            text += f" Runner-up: {u.name}: " + "; ".join(u.why) + "."
    return text


def table_text(a: Advice) -> str:
    """The terminal table (aligned columns) and the verdict."""
    body = [_HEAD, *rows(a)]
    widths = [max(len(r[i]) for r in body) for i in range(len(_HEAD))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body]
    head = (f"{a.workload} on {a.engine} ({a.paradigm}), failures {a.trace}; seconds are "
            f"{a.clock}; failure-free: {a.baseline.iterations} iterations, "
            f"{a.baseline.seconds:.3g} s")
    return "\n".join([head, "", *lines, "", verdict(a)])


def markdown(a: Advice, plot: str | None) -> str:
    """``advice.md``: the table, the reasons per candidate, the calibration, the plot."""
    b = a.baseline
    md = [f"# Advice: {a.workload} on {a.engine}", "",
          f"Failures: `{a.trace}` (MTBF {a.mtbf:g} {a.clock}). Every second below is on that "
          "clock" + (" (the sim engine's virtual clock, engines/sim/clock.py)"
                     if a.engine == "sim" else "") + ".", "", verdict(a), "",
          "| " + " | ".join(_HEAD) + " |", "|" + " --- |" * len(_HEAD)]
    md += ["| " + " | ".join(r) + " |" for r in rows(a)]
    md += ["", "## Why", ""]
    md += [f"- **{p.label}**: " + "; ".join(p.why) + "." for p in a.predictions]
    c = f"{b.contraction:.5f} (r2 {b.fit_r2:.2f})" if b.contraction is not None else "not fitted"
    md += ["", "## Calibration", "",
           f"Failure-free ({b.strategy}): {b.iterations} iterations, {b.seconds:.4g} s to "
           f"target ({b.step_seconds:.4g} s a step); contraction rate c = {c}.", "",
           "| strategy | interval | C s (spread) | async write s | failures at | mean recovery s | "
           "mean rework it | mean steps lost | mean SCAR bound it |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in a.measured:
        spread = m.steady_spread * (m.interval or 0) * b.step_seconds
        md.append(f"| {m.name} | {m.interval or '-'} | {m.checkpoint_seconds:.4g} "
                  f"({spread:.2g}) | {m.write_seconds:.4g} | "
                  f"{', '.join(map(str, m.failed_at)) or '-'} | "
                  f"{_n(m.recovery_seconds)} | {_n(m.rework, '.0f')} | "
                  f"{_n(m.lost_steps, '.1f')} | {_n(m.rework_bound)} |")
    md += ["", "Model (lab/advise/model.py): time to target = failure-free time x (1 + "
           "checkpoint overhead) / (1 - lost per failure / MTBF); the interval is Young/Daly's "
           "sqrt(2 C MTBF), C being what one interval's saves add to a run, read off the "
           "steps of a run by their place after the last save (lab/advise/wall.py); a "
           "failure's cost is measured from one failure half an interval after a save half "
           "way to the target, within that run: its recovery, and the steps lost beyond it "
           "(rework, and slow steps after it), with SCAR's bound next to the rework; cost = "
           "nodes x time x price (lab/cloud_cost.py)."]
    if plot:
        md += ["", f"![predicted time to target]({plot})"]
    return "\n".join(md) + "\n"


def write(a: Advice, out: Path) -> None:
    """Write the advice folder (module docstring)."""
    from trainthrough.lab.advise.plot import plot_advice

    write_folder(out, lambda png: plot_advice(a, png), lambda name: markdown(a, name),
                 a.to_dict())


def write_folder(out: Path, plot: Callable[[Path], Path], md: Callable[[str], str],
                 data: dict[str, Any]) -> None:
    """An advice folder, predicted or measured: refused if used, then the plot, the
    markdown naming it, and the JSON last (its presence: the folder is complete)."""
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    png = plot(out / "advice.png")
    atomic_write(out / "advice.md", md(png.name))
    atomic_write(out / "advice.json", json.dumps(data, indent=2, allow_nan=False) + "\n")
