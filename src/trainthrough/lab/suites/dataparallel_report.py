"""Report sections of the data-parallel suite: the trade-off table and scatter, and the
performance model's prediction against the measured overhead.

Each run is paired with the failure-free run of the same workload and seed (the
``failure-free`` rows); both trained the same number of committed steps, so the
differences are what the failures and their recovery cost.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from trainthrough.lab import perf_model as pm
from trainthrough.lab.recorder import complete, read_jsonl_tolerant
from trainthrough.lab.suites.dataparallel_cost import COST

Row = dict[str, Any]


def _accuracy(suite_dir: Path, row: Row) -> float | None:
    """Test accuracy at the run's last evaluation (mlr: its test_accuracy extra); None
    for an incomplete run (no summary.json: its last evaluation is not the run's)."""
    folder = suite_dir / "runs" / str(row["run_id"])
    recs = read_jsonl_tolerant(folder / "metrics.jsonl") if complete(folder) else None
    if not recs:
        return None
    last = recs[-1]
    v = last.get("test_accuracy", last.get("metric") if row.get("metric_name") == "accuracy"
                 else None)
    return float(v) if isinstance(v, int | float) else None


def measures(suite_dir: Path, rows: list[Row]) -> list[Row]:
    """One record per failing run: accuracy loss (points) and overhead against its twin."""
    base = {(r["workload"], r["seed"]): r for r in rows if r.get("strategy") == "failure-free"}
    out = []
    for r in rows:
        b = base.get((r["workload"], r["seed"]))
        if r.get("strategy") == "failure-free" or b is None:
            continue
        a, ab = _accuracy(suite_dir, r), _accuracy(suite_dir, b)
        over = float(r["sim_seconds"]) - float(b["sim_seconds"])
        out.append({**{k: r.get(k) for k in ("workload", "seed", "strategy", "preset", "elastic",
                                             "phase", "failures_planned", "fail")},
                    "acc_loss": None if a is None or ab is None else 100 * (ab - a),
                    "overhead_s": over, "overhead_pct": 100 * over / float(b["sim_seconds"]),
                    "base_seconds": float(b["sim_seconds"]),
                    "exact": r.get("logical_iterations") == b.get("logical_iterations")})
    return out


def _mean(xs: list[Any]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def _groups(ms: list[Row], keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[Row]]:
    out: dict[tuple[Any, ...], list[Row]] = {}
    for m in ms:
        out.setdefault(tuple(m[k] for k in keys), []).append(m)
    return out


def headline(rows: list[Row]) -> str:
    """The terminal table: mean accuracy loss and overhead per strategy and failure count."""
    # rows here lack the suite folder; accuracy needs metrics files, so show overhead only
    # when called without them (run_suite passes the loaded results.csv rows).
    lines = [f"{'workload':<6} {'strategy':<28} {'fails':>5} {'overhead %':>11} {'runs':>5}"]
    base = {(r["workload"], r["seed"]): float(r["sim_seconds"]) for r in rows
            if r.get("strategy") == "failure-free"}
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in rows:
        b = base.get((r["workload"], r["seed"]))
        if r.get("strategy") != "failure-free" and b:
            key = (r["workload"], r["strategy"], r["failures_planned"])
            groups.setdefault(key, []).append(100 * (float(r["sim_seconds"]) - b) / b)
    for (w, s, f), xs in groups.items():
        lines.append(f"{w:<6} {s:<28} {f:>5} {statistics.fmean(xs):>11.1f} {len(xs):>5}")
    return "\n".join(lines)


def tradeoff_section(suite_dir: Path, rows: list[Row]) -> tuple[str, str]:
    """Table and scatter of accuracy loss against runtime overhead."""
    from trainthrough.lab.plots_dp import plot_tradeoff

    ms = measures(suite_dir, rows)
    png = plot_tradeoff(ms, suite_dir / "plots" / "accuracy-loss-vs-overhead.png")
    lines = ["| workload | strategy | failures | accuracy loss (points) | worst | "
             "overhead (s) | overhead (%) | runs |", "| --- | --- | ---: | ---: | ---: | ---: | "
             "---: | ---: |"]
    for (w, s, f), g in _groups(ms, ("workload", "strategy", "failures_planned")).items():
        losses = [m["acc_loss"] for m in g if m["acc_loss"] is not None]
        lines.append(f"| {w} | {s} | {f} | {_fmt(_mean(losses))} | "
                     f"{_fmt(max(losses) if losses else None)} | "
                     f"{_fmt(_mean([m['overhead_s'] for m in g]), '.3f')} | "
                     f"{_fmt(_mean([m['overhead_pct'] for m in g]), '.1f')} | {len(g)} |")
    phase = ["| workload | phase | lossy-forward loss, 1 failure | lossy-forward loss, 3 failures |",
             "| --- | --- | ---: | ---: |"]
    lossy = [m for m in ms if m["preset"] == "lossy-forward"]
    for (w, p), g in _groups(lossy, ("workload", "phase")).items():
        one = _mean([m["acc_loss"] for m in g if m["failures_planned"] == 1])
        three = _mean([m["acc_loss"] for m in g if m["failures_planned"] == 3])
        phase.append(f"| {w} | {p} | {_fmt(one)} | {_fmt(three)} |")
    inexact = sum(not m["exact"] for m in ms)
    note = (f"\n\n{inexact} run(s) did not end on the failure-free run's step count."
            if inexact else "")
    body = (f"![accuracy loss vs overhead](plots/{png.name})\n\n"
            "Means over seeds and failure phases; a negative loss means the run ended more "
            "accurate than its failure-free twin (SGD noise)." + note + "\n\n"
            + "\n".join(lines) + "\n\nLossy-forward by failure phase (accuracy loss, points; "
            "an `update` failure strikes after the reduction, so nothing is dropped):\n\n"
            + "\n".join(phase))
    return "Accuracy loss vs runtime overhead", body


def predicted(m: Row, rows: list[Row]) -> float | None:
    """The perf model's overhead (seconds) for the run behind measure ``m``."""
    import torch

    from trainthrough.dp.rank import Rank
    from trainthrough.workloads import make_workload

    w = make_workload(m["workload"], seed=0)
    x0 = w.init_params(torch.Generator().manual_seed(0))
    state = Rank(0, w, w.default_optimizer, x0, 0).state_bytes
    mine = [r for r in rows if r["workload"] == m["workload"]]
    steps, every = int(mine[0]["steps"]), int(mine[0]["every"])
    step = m["base_seconds"] / steps
    ck = [float(r["checkpoint_blocked_seconds"]) / int(r["checkpoints"]) for r in rows
          if r["workload"] == m["workload"] and r.get("preset") == "checkpoint-restart"
          and int(r.get("checkpoints") or 0) > 0]
    ckpt = statistics.fmean(ck) if ck else 0.0
    keep_global = m["elastic"] == "keep-global" and m["preset"] != "checkpoint-restart"
    c = pm.DPCosts(step_seconds=step, checkpoint_seconds=ckpt, mtbf_seconds=1e9,
                   detection_seconds=COST.detection_seconds, reform_seconds=COST.reform_seconds,
                   restart_seconds=COST.restart_seconds,
                   compute_share=min(1.0, w.step_seconds * COST.compute_scale / step),
                   ranks=4 if keep_global else 0, replace_seconds=COST.replace_seconds,
                   join_seconds=COST.reform_seconds + COST.network_latency
                   + state / COST.network_bandwidth)
    model = {"checkpoint-restart": lambda: pm.checkpoint_restart(c, every * step),
             "rollback": lambda: pm.rollback(c), "lossy-forward": lambda: pm.lossy_forward(c)}
    o = model[m["preset"]]()
    return o.steady_fraction * m["base_seconds"] + o.per_failure_seconds * m["failures_planned"]


def model_section(suite_dir: Path, rows: list[Row]) -> tuple[str, str]:
    """Predicted (lab/perf_model.py) against measured overhead, per strategy."""
    ms = measures(suite_dir, rows)
    lines = ["| workload | strategy | failures | predicted (s) | measured (s) | measured / predicted |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    cache: dict[tuple[Any, ...], float | None] = {}
    for (w, s, f), g in _groups(ms, ("workload", "strategy", "failures_planned")).items():
        preds = []
        for m in g:
            key = (w, s, f, m["base_seconds"])
            if key not in cache:
                cache[key] = predicted(m, rows)
            preds.append(cache[key])
        p, meas = _mean(preds), _mean([m["overhead_s"] for m in g])
        ratio = meas / p if p and meas is not None else None
        lines.append(f"| {w} | {s} | {f} | {_fmt(p, '.3f')} | {_fmt(meas, '.3f')} | "
                     f"{_fmt(ratio)} |")
    body = ("Predicted: steady part (checkpoints) plus, per failure, "
            "detection, re-formation and what is redone or lost: half a step for rollback, "
            "half a checkpoint interval plus restart and read for checkpoint-restart, and for "
            "keep-global the slower shrunk steps until the replacement joins "
            "(lab/perf_model.py). Measured: simulated seconds beyond the failure-free run. "
            "Rollback redoes more than half a step when the failure strikes late in it "
            "(its allreduce).\n\n" + "\n".join(lines))
    return "Performance model: predicted vs measured overhead", body
