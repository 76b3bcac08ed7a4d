"""What the data-parallel advisor prints and writes (measured.py): a table, the verdict,
a plot of time to target per candidate, JSON and markdown.

The folder is report.py's: ``advice.md``, ``advice.png``, then ``advice.json`` last;
one that exists and is not empty is refused before anything runs.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from trainthrough.lab.advise.measured import DpAdvice, DpResult
from trainthrough.lab.advise.report import write_folder
from trainthrough.lab.plots import DPI

_HEAD = ("rank", "strategy", "sync", "time to target s (+- SE)", "failure-free s",
         "failures", "goodput", "final metric")


def _n(v: float | None, spec: str = ".3g") -> str:
    return "not reached" if v is None else format(v, spec)


def rows(a: DpAdvice) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for i, r in enumerate(a.results, 1):
        se = f" +- {r.to_target_se:.2g}" if r.to_target_se is not None else ""
        sync = f"relaxed, H={a.sync_every}" if r.family == "relaxed" else "synchronous"
        g = r.mean_goodput
        metrics = [m for m in r.final_metric if m is not None]
        out.append((str(i), r.name, sync, _n(r.to_target) + se, _n(r.free_to_target),
                    f"{r.mean_failures:.1f}", "n/a" if g is None else f"{g:.1f}%",
                    f"{sum(metrics) / len(metrics):.4g}" if metrics else "n/a"))
    return out


def _why(r: DpResult) -> str:
    t = r.to_target
    if t is None:
        return (f"did not reach the target on every seed ({r.mean_failures:.1f} failures "
                "a run)")
    g = r.mean_goodput
    return (f"{t:.3g} s to target with {r.mean_failures:.1f} failures a run"
            + ("" if g is None else f", {g:.1f}% of its failure-free throughput")
            + (f", {r.free_to_target:.3g} s failure-free" if r.free_to_target else ""))


def verdict(a: DpAdvice) -> str:
    """The recommendation, the runner-up, and which family wins at this rate."""
    r, u = a.recommended, a.runner_up
    text = (f"Recommended: {r.name}. Least measured time to target at an MTBF of "
            f"{a.mtbf:g} {a.clock} ({a.seeds} seed{'s' if a.seeds > 1 else ''}): "
            f"{_why(r)}.")
    if u is not None:
        if r.to_target and u.to_target:
            gap = 100 * (u.to_target / r.to_target - 1)
            text += f" Runner-up: {u.name}, {gap:.1f}% slower: {_why(u)}."
            noise = ((r.to_target_se or 0.0) ** 2 + (u.to_target_se or 0.0) ** 2) ** 0.5
            if a.seeds == 1:
                text += (" One seed: how much that gap moves from seed to seed is not "
                         "known; --calibration-seeds 3 would tell.")
            elif u.to_target - r.to_target < noise:
                text += (f" The two differ by less than the seeds' spread (+- {noise:.2g} "
                         "s): either will do; more --calibration-seeds would tell them "
                         "apart.")
        else:
            text += f" Runner-up: {u.name}: {_why(u)}."
    sync, relaxed = a.best("synchronous"), a.best("relaxed")
    if sync is not None and relaxed is not None:
        winner, loser = (relaxed, sync) if a.results.index(relaxed) < a.results.index(
            sync) else (sync, relaxed)
        deal = "relaxed sync" if winner is relaxed else "synchronous data parallel"
        text += (f" At this failure rate {deal} is the better deal: {winner.name} against "
                 f"the best {loser.family} candidate, {loser.name}"
                 + _lead(winner, loser) + ".")
    return text


def _lead(w: DpResult, lo: DpResult) -> str:
    """How much of the winner's lead is there without failures: relaxed sync changes the
    optimization too (DiLoCo's outer momentum), not only what a failure costs."""
    if not (w.to_target and lo.to_target and w.free_to_target and lo.free_to_target):
        return ""
    return (f" ({lo.to_target / w.to_target:.2f}x as fast with the failures, "
            f"{lo.free_to_target / w.free_to_target:.2f}x without: "
            + ("the lead is mostly the optimization, not fault tolerance)"
               if lo.free_to_target / w.free_to_target >= lo.to_target / w.to_target
               else "failures widen the lead)"))


def table_text(a: DpAdvice) -> str:
    body = [_HEAD, *rows(a)]
    widths = [max(len(r[i]) for r in body) for i in range(len(_HEAD))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body]
    head = (f"{a.workload} on {a.engine} (dp, {a.ranks} ranks), failures {a.trace}; "
            f"seconds are {a.clock}; measured, not predicted")
    return "\n".join([head, "", *lines, "", verdict(a)])


def markdown(a: DpAdvice, plot: str) -> str:
    md = [f"# Advice: {a.workload} on {a.engine}, data parallel", "",
          f"Failures: `{a.trace}` (MTBF {a.mtbf:g} {a.clock}), {a.ranks} ranks. Every "
          "candidate ran to the target, failure-free and on this trace, on each of "
          f"{a.seeds} seed(s); the numbers are those runs' (lab/advise/measured.py), not a "
          "model's prediction: at another failure rate, advise again.", "", verdict(a), "",
          "| " + " | ".join(_HEAD) + " |", "|" + " --- |" * len(_HEAD)]
    md += ["| " + " | ".join(r) + " |" for r in rows(a)]
    md += ["", "Goodput: committed samples a second over the same candidate's failure-free "
           "run (a replica's local steps count once they reach an outer step; lossy "
           "forward's dropped share does not). Relaxed candidates take "
           f"H={a.sync_every} inner steps between outer steps (--sync-every).", "",
           f"![time to target]({plot})"]
    return "\n".join(md) + "\n"


def plot(a: DpAdvice, out: Path) -> Path:
    """Time to target per candidate, failure-free and with the failures, best on top."""
    res = a.results
    fig = Figure(figsize=(8.0, 1.2 + 0.55 * len(res)), dpi=DPI)
    ax = fig.subplots()
    right = max([x for r in res for x in (r.to_target, r.free_to_target) if x] or [1.0])
    for y, r in enumerate(reversed(res)):
        color = "#e6550d" if r.family == "relaxed" else "#3182bd"
        if r.free_to_target:
            ax.barh(y + 0.18, r.free_to_target, height=0.34, color="#cccccc",
                    label="failure-free" if y == 0 else None)
        if r.to_target:
            ax.barh(y - 0.18, r.to_target, height=0.34, color=color,
                    xerr=r.to_target_se, ecolor="#444444", capsize=3)
        else:
            ax.text(0.01 * right, y - 0.18, "target not reached", va="center", fontsize=8)
    ax.barh(0, 0, color="#3182bd", label="with failures: synchronous")
    ax.barh(0, 0, color="#e6550d", label="with failures: relaxed")
    ax.set_yticks(range(len(res)), [r.name for r in reversed(res)])
    ax.set_xlim(0, right * 1.15)
    ax.set_xlabel(f"measured time to target ({a.clock})")
    fig.suptitle(f"{a.workload} on {a.engine}, {a.ranks} ranks, {a.trace}", fontsize=10)
    ax.legend(fontsize=8, loc="lower center", ncol=3, bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    fig.tight_layout()
    fig.savefig(out)
    return out


def write(a: DpAdvice, out: Path) -> None:
    write_folder(out, lambda png: plot(a, png), lambda name: markdown(a, name), a.to_dict())
