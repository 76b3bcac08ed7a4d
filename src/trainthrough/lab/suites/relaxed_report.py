"""Report of the relaxed-synchronization suite: goodput, time to target, bytes per sample
and accuracy per strategy and failure rate, the goodput plot, and where relaxed sync
overtakes synchronous rollback.

Each run is paired with the failure-free run of the same strategy and seed (``fail`` =
``none``); time to target is compared with synchronous rollback's failure-free run.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from trainthrough.lab.suites.dataparallel_report import _accuracy

Row = dict[str, Any]


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x else None  # NaN: none


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def measures(suite_dir: Path | None, rows: list[Row]) -> list[Row]:
    """One record per run: its rate, goodput, time to target, bytes/sample, accuracy."""
    free = {(r["strategy"], r["seed"]): r for r in rows if r.get("fail") == "none"}

    def rate_of(r: Row | None) -> float | None:
        if r is None:
            return None
        secs, samples = _num(r.get("sim_seconds")), _num(r.get("samples_committed"))
        return samples / secs if secs and samples is not None else None

    out = []
    for r in rows:
        b = free.get((r["strategy"], r["seed"]))
        secs, samples = _num(r.get("sim_seconds")), _num(r.get("samples_committed"))
        if b is None or not secs or samples is None:
            continue
        bsecs, bsamples = _num(b.get("sim_seconds")), _num(b.get("samples_committed"))
        rate = samples / secs
        base = bsamples / bsecs if bsamples and bsecs else None
        acc = _accuracy(suite_dir, r) if suite_dir is not None else None
        bacc = _accuracy(suite_dir, b) if suite_dir is not None else None
        sync = rate_of(free.get(("rollback", r["seed"])))
        out.append({
            "vs_sync": None if not sync else 100.0 * rate / sync,
            "strategy": r["strategy"], "family": r.get("family"), "fail": r["fail"],
            "seed": r["seed"], "failures": int(r.get("failures") or 0),
            "per_100s": 100.0 * int(r.get("failures") or 0) / secs,
            "goodput": None if not base else 100.0 * rate / base,
            "to_target": _num(r.get("sim_seconds_to_target")),
            "bytes_per_sample": (_num(r.get("allreduce_bytes")) or 0.0) / samples
            if samples else None,
            "accuracy": None if acc is None else 100.0 * acc,
            "acc_delta": None if acc is None or bacc is None else 100.0 * (acc - bacc)})
    return out


def _order(ms: list[Row]) -> list[str]:
    """Failure rates, failure-free first, then by the mean measured rate."""
    rates: dict[str, list[float]] = {}
    for m in ms:
        rates.setdefault(m["fail"], []).append(m["per_100s"])
    return sorted(rates, key=lambda f: statistics.fmean(rates[f]))


def _cell(ms: list[Row], strategy: str, fail: str, key: str) -> float | None:
    return _mean([m[key] for m in ms if m["strategy"] == strategy and m["fail"] == fail])


def headline(rows: list[Row]) -> str:
    """The terminal table: mean goodput (%) per strategy (rows) and failure rate (columns)."""
    ms = measures(None, rows)
    fails = _order(ms)
    strategies = list(dict.fromkeys(m["strategy"] for m in ms))
    lines = ["goodput vs failure-free (%)", f"{'strategy':<20}"
             + "".join(f"{f:>12}" for f in fails)]
    for s in strategies:
        lines.append(f"{s:<20}" + "".join(f"{_fmt(_cell(ms, s, f, 'goodput')):>12}"
                                          for f in fails))
    return "\n".join(lines)


def crossover(ms: list[Row], key: str, relaxed: str = "localsgd",
              sync: str = "rollback") -> str:
    """At which failure rates ``relaxed`` does better than ``sync`` on ``key``
    (``vs_sync``, samples/s against rollback's failure-free run: higher is better; time
    to target: lower), and where it falls behind, as a sentence."""
    better = (lambda a, b: a > b) if key != "to_target" else (lambda a, b: a < b)
    what = "samples/s" if key == "vs_sync" else "time to target"
    ahead: list[str] = []
    behind: list[str] = []
    for f in _order(ms):
        a, b = _cell(ms, relaxed, f, key), _cell(ms, sync, f, key)
        if a is None or b is None:
            continue
        rate = _mean([m["per_100s"] for m in ms if m["fail"] == f and m["strategy"] == sync])
        (ahead if better(a, b) else behind).append(
            f"{f} ({_fmt(rate, '.1f')}/100 s: {_fmt(a, '.2f')} vs {_fmt(b, '.2f')})")
    if not ahead and not behind:
        return f"{relaxed} vs {sync} ({what}): not measured."
    return (f"On {what}, {relaxed} is ahead of {sync} at {', '.join(ahead) or 'no rate'}; "
            f"behind at {', '.join(behind) or 'no rate'}.")


def goodput_section(suite_dir: Path, rows: list[Row]) -> tuple[str, str]:
    """The table per strategy and failure rate, the goodput plot and the crossovers."""
    ms = measures(suite_dir, rows)
    png = plot_goodput(ms, suite_dir / "plots" / "goodput-vs-failure-rate.png")
    lines = ["| strategy | failures | per 100 s | goodput (%) | samples/s vs rollback "
             "failure-free (%) | time to target (s) | bytes / sample | accuracy (%) | "
             "vs failure-free (points) | runs |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for f in _order(ms):
        for s in dict.fromkeys(m["strategy"] for m in ms):
            g = [m for m in ms if m["strategy"] == s and m["fail"] == f]
            if not g:
                continue
            lines.append(
                f"| {s} | {f} | {_fmt(_mean([m['per_100s'] for m in g]), '.2f')} | "
                f"{_fmt(_mean([m['goodput'] for m in g]))} | "
                f"{_fmt(_mean([m['vs_sync'] for m in g]))} | "
                f"{_fmt(_mean([m['to_target'] for m in g]), '.2f')} | "
                f"{_fmt(_mean([m['bytes_per_sample'] for m in g]), '.0f')} | "
                f"{_fmt(_mean([m['accuracy'] for m in g]), '.2f')} | "
                f"{_fmt(_mean([m['acc_delta'] for m in g]), '+.2f')} | {len(g)} |")
    sentences = [crossover(ms, "vs_sync"), crossover(ms, "to_target"),
                 crossover(ms, "vs_sync", relaxed="diloco")]
    body = (f"![goodput vs failure rate](plots/{png.name})\n\n"
            + "\n\n".join(sentences) + "\n\nLocalSGD is the like-for-like comparison with "
            "synchronous SGD (with H = 1 it is synchronous SGD); DiLoCo's outer Nesterov "
            "momentum also changes the optimization, so its time to target says as much about "
            "the optimizer as about failures. Means over seeds; n/a: target not reached.\n\n"
            + "\n".join(lines))
    return "Goodput, time to target and bytes against failure rate", body


def plot_goodput(ms: list[Row], out: Path) -> Path:
    """Goodput (%) against measured failures per 100 s, one line per strategy (PNG)."""
    from matplotlib.figure import Figure

    from trainthrough.lab.plots import DPI, strategy_colors

    strategies = list(dict.fromkeys(m["strategy"] for m in ms))
    colors = strategy_colors(strategies)
    fig = Figure(figsize=(6.4, 4.3))
    ax = fig.add_subplot(1, 1, 1)
    for s in strategies:
        pts = []
        for f in _order(ms):
            g = [m for m in ms if m["strategy"] == s and m["fail"] == f and m["goodput"]]
            if g:
                pts.append((statistics.fmean(m["per_100s"] for m in g),
                            statistics.fmean(m["goodput"] for m in g)))
        if pts:
            ls = "--" if s in ("localsgd", "diloco", "streaming-diloco") else "-"
            ax.plot(*zip(*pts), marker="o", ls=ls, color=colors.get(s, "0.3"), label=s)
    ax.set_xlabel("failures per 100 simulated seconds")
    ax.set_ylabel("goodput vs failure-free (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out
