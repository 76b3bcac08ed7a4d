"""Running the scale suite's grid and writing its folder: ``results.csv`` (one row per
variant, size and seed), ``report.md`` and ``report.html`` (the parameters, goodput and
time-to-train tables, the crossovers, the validation table), ``plots/goodput.png`` and
``parameters.json`` (every parameter the grid ran with)."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainthrough._atomic import atomic_open, atomic_write
from trainthrough.lab.progress import make_progress
from trainthrough.lab.report_html import html_page
from trainthrough.lab.scale.model import GIVE_UP, Outcome, mean_goodput, simulate
from trainthrough.lab.scale.params import ScaleParams
from trainthrough.lab.scale.plot import TIE, Crossover, crossovers, plot_goodput
from trainthrough.lab.scale.validation import (
    DOWNTIME_FACTOR,
    ETTR_MARGIN,
    PUBLISHED,
    Checked,
    check,
)
from trainthrough.lab.scale.variants import VARIANTS

TITLE = "Scale suite: goodput of every data-parallel strategy from 8 to 100,000 accelerators"
SYNC, RELAXED = "synchronous (best)", "relaxed sync (best)"


def _row(o: Outcome) -> dict[str, Any]:
    row = {k: v for k, v in asdict(o).items() if k != "downtimes"}
    row["strategy"] = row.pop("variant")
    row["accelerators"] = row.pop("n")
    row["goodput"] = o.goodput
    row["hours"] = o.seconds / 3600
    row["downtime_mean_seconds"] = o.downtime
    return row


def _grid(p: ScaleParams, seeds: int, quiet: bool) -> list[Outcome]:
    out: list[Outcome] = []
    with make_progress(quiet) as progress:
        task = progress.add_task("scale: model runs", total=len(VARIANTS) * len(p.sizes) * seeds,
                                 status="")
        for n in p.sizes:
            for v in VARIANTS:
                for seed in range(seeds):
                    out.append(simulate(v, p, n, seed))
                    progress.advance(task)
                    progress.update(task, status=f"{v.name} at {n}")
    return out


def _table(headers: list[str], rows: list[list[str]], text: bool = False) -> str:
    """A markdown table: the columns after the first right-aligned (numbers), or every
    column left-aligned (``text``)."""
    right = [i > 0 and not text for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(" ---: " if r else " --- " for r in right) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _validation_md(checks: list[Checked]) -> str:
    rows = []
    for c in checks:
        pt = c.point
        if pt.measure == "ettr":
            pub = f"{pt.relation} {100 * pt.value:.0f}% ETTR"
            ours = f"{100 * c.ours:.1f}%"
            diff = f"{100 * c.difference:+.1f} points"
            gap = f"{c.gap:+.0f} s per failure"
        else:
            pub = f"{pt.relation} {pt.value:.0f} s downtime per failure"
            ours = f"{c.ours:.1f} s"
            diff = f"{c.difference:+.1f} s ({c.ours / pt.value:.2f}x)"
            gap = f"{c.gap:.1f}x ours"
        given = ", ".join(f"{k}={v}" for k, v in pt.given.items()) or "size and length"
        rows.append([pt.name, pt.source, f"{pt.n:,}", f"{pt.days:g} d", pt.variant.name, pub,
                     ours, diff, "yes" if c.within else "**no**", gap,
                     f"{c.failures:.0f}", given, "; ".join(pt.assumed)])
    return _table(["published point", "source", "accelerators", "length", "our variant",
                   "published", "ours", "difference", "within margin", "to match",
                   "failures (model)", "given", "assumed"], rows, text=True)


def _summary(p: ScaleParams, outcomes: list[Outcome]) -> tuple[dict[str, list[float]],
                                                                dict[str, list[float]]]:
    good: dict[str, list[float]] = {}
    hours: dict[str, list[float]] = {}
    for v in VARIANTS:
        for n in p.sizes:
            runs = [o for o in outcomes if o.variant == v.name and o.n == n]
            good.setdefault(v.name, []).append(mean_goodput(runs))
            hours.setdefault(v.name, []).append(sum(o.seconds for o in runs) / len(runs) / 3600)
    return good, hours


def _pct(g: float, gave_up: set[tuple[str, int]], name: str, n: int) -> str:
    return f"{100 * g:.2f}%" + ("\\*" if (name, n) in gave_up else "")


def _best(good: dict[str, list[float]], names: list[str]) -> list[float]:
    return [max(good[n][i] for n in names) for i in range(len(next(iter(good.values()))))]


def _crossings(p: ScaleParams, good: dict[str, list[float]]) -> tuple[list[Crossover], list[str]]:
    sizes = list(p.sizes)
    sync = [v.name for v in VARIANTS if not v.relaxed]
    relaxed = [v.name for v in VARIANTS if v.relaxed]
    pairs = [("checkpoint-restart", "rollback", good["checkpoint-restart"], good["rollback"]),
             ("checkpoint-restart/young-daly", "rollback", good["checkpoint-restart/young-daly"],
              good["rollback"]),
             (SYNC, RELAXED, _best(good, sync), _best(good, relaxed))]
    found: list[Crossover] = []
    lines = []
    for a, b, ga, gb in pairs:
        cs = crossovers(sizes, a, b, ga, gb)
        found += cs
        if cs:
            lines += [f"{c.ahead} overtakes {c.behind} at about {c.size:,.0f} accelerators "
                      f"(goodput {100 * c.goodput:.1f}%)" for c in cs]
        else:
            diffs = [y - x for x, y in zip(ga, gb, strict=True)]
            lead = (f"{b} is ahead of {a} or tied (within {100 * TIE:g} point) at every size"
                    if min(diffs) > -TIE else
                    f"{a} is ahead of {b} or tied (within {100 * TIE:g} point) at every size"
                    if max(diffs) < TIE else f"{a} and {b} do not cross")
            lines.append(f"{lead} from {sizes[0]:,} to {sizes[-1]:,}: no crossover in this range "
                         f"(difference {100 * min(diffs):+.2f} to {100 * max(diffs):+.2f} points)")
    return found, lines


def write(p: ScaleParams, seeds: int, out: Path, quiet: bool = False,
          checks: list[Checked] | None = None) -> str:
    """Run the grid into ``out`` (which must not hold a report already), write the
    folder, and return the headline (the goodput table as text)."""
    outcomes = _grid(p, seeds, quiet)
    out.mkdir(parents=True, exist_ok=True)
    rows = [_row(o) for o in outcomes]
    with atomic_open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    # The parameters as data too (the report shows them as a table).
    atomic_write(out / "parameters.json", json.dumps(
        {**{k: getattr(p, k) for k, _ in p.rows()}, "seeds": seeds}, indent=1) + "\n",
        encoding="utf-8")
    good, hours = _summary(p, outcomes)
    gave_up = {(o.variant, o.n) for o in outcomes if not o.finished}
    found, cross_lines = _crossings(p, good)
    png = plot_goodput(list(p.sizes), good, hours, found, out / "plots" / "goodput.png")
    if checks is None and p.validate:
        checks = [check(pt, p, seeds=max(1, min(seeds, 2))) for pt in PUBLISHED]
    sizes = [f"{n:,}" for n in p.sizes]
    md = [f"# {TITLE}", "",
          f"- A discrete-event model on the sim engine's virtual clock, {seeds} seed(s) per "
          f"cell, every variant on the same failure trace per size and seed; decisions by "
          "the runtime's policy objects (ft/dp_policies.py, the checkpoint policy, the "
          "elastic and replacement policies, dp/relaxed.py's SyncSpec).",
          f"- {p.steps:,} steps of {p.step_seconds:g} s each; goodput = the same steps' "
          "failure-free time without fault-tolerance costs over the time they took "
          "(effective training time ratio; checkpoint writes count as lost).",
          "- Relaxed sync's steps are counted as worth a synchronous step each; what it costs "
          "in convergence is not modelled here (the relaxed suite measures it).",
          "", "## Parameters", "",
          _table(["option", "value"], [[k, f"`{v}`"] for k, v in p.rows()], text=True), "",
          "## Goodput", "",
          _table(["strategy", *sizes], [[n, *(_pct(g, gave_up, n, size)
                                              for g, size in zip(gs, p.sizes, strict=True))]
                                        for n, gs in good.items()]), "",
          *([f"\\* did not finish within {GIVE_UP:g} times its failure-free time (no "
             "progress); the goodput shown is what it had reached, an upper bound.", ""]
            if gave_up else []),
          "## Time to train", "", f"Hours to train {p.steps:,} steps (mean over seeds).", "",
          _table(["strategy", *sizes], [[n, *(f"{h:.1f}" for h in hs)]
                                        for n, hs in hours.items()]), "",
          "## Crossovers", "", *[f"- {line}" for line in cross_lines], "",
          f"![goodput against cluster size]({png.relative_to(out).as_posix()})", "",
          "## Where the time went", "",
          f"At {p.sizes[-1]:,} accelerators, hours per run (mean over seeds).", "",
          _breakdown(p.sizes[-1], outcomes), "",
          "## Strategies", "", *[f"- **{v.name}**: {v.describe()}" for v in VARIANTS], ""]
    md += ["## Validation against published figures", ""]
    if checks:
        md += [f"Margins: effective training time within {100 * ETTR_MARGIN:.0f} points (a "
               f"published bound: on its side); downtime within a factor of "
               f"{DOWNTIME_FACTOR:g}. *To match*: the downtime per failure the model would "
               "have to add to take the published time (ETTR), or the published downtime "
               "over ours.", "", _validation_md(checks), ""]
    else:
        md += ["Not run (validate=false).", ""]
    text = "\n".join(md)
    atomic_write(out / "report.md", text, encoding="utf-8")
    atomic_write(out / "report.html", html_page(TITLE, text, out), encoding="utf-8")
    head = ["strategy", *sizes]
    widths = [max(len(h), 30 if i == 0 else 9) for i, h in enumerate(head)]
    lines = ["goodput (effective training time)",
             "  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(head, widths, strict=True)))]
    for name, gs in good.items():
        cells = [name, *(_pct(g, gave_up, name, size).replace("\\", "")
                         for g, size in zip(gs, p.sizes, strict=True))]
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(cells, widths, strict=True))))
    if gave_up:
        lines.append(f"* did not finish within {GIVE_UP:g} times its failure-free time")
    lines += cross_lines
    for c in checks or []:
        pt, pct = c.point, c.point.measure == "ettr"
        ours = f"{100 * c.ours:.1f}%" if pct else f"{c.ours:.1f} s"
        pub = f"{100 * pt.value:.0f}%" if pct else f"{pt.value:.0f} s"
        lines.append(f"validation: {pt.name}: ours {ours}, published {pt.relation} {pub} "
                     f"({'within' if c.within else 'outside'} the margin)")
    return "\n".join(lines)


def _breakdown(n: int, outcomes: list[Outcome]) -> str:
    rows = []
    for v in VARIANTS:
        runs = [o for o in outcomes if o.variant == v.name and o.n == n]
        k = len(runs) * 3600

        def mean(attr: str, runs: list[Outcome] = runs, k: float = k) -> str:
            return f"{sum(getattr(o, attr) for o in runs) / k:.2f}"
        rows.append([v.name, mean("ideal_seconds"), mean("checkpoint_seconds"),
                     mean("recovery_seconds"), mean("lost_seconds"), mean("join_seconds"),
                     f"{sum(o.failures for o in runs) / len(runs):.0f}",
                     str(runs[0].interval_steps or "-")])
    return _table(["strategy", "failure-free", "checkpoints", "recovering", "work lost",
                   "joins", "failures", "checkpoint every (steps)"], rows)

