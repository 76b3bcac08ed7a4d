"""The advisor's plot: each candidate's predicted time to target, split into its parts."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from trainthrough.lab.advise.advisor import Advice
from trainthrough.lab.advise.model import Prediction
from trainthrough.lab.plots import DPI

_PARTS = {"failure-free work": "#9ecae1", "checkpoints": "#3182bd", "recovering": "#fd8d3c",
          "rework": "#e6550d"}


def plot_advice(a: Advice, out: Path) -> Path:
    """Horizontal stacked bars, best candidate on top; 'no progress' (and why) where a
    failure costs at least the MTBF or the calibration run never reached the target."""
    preds = a.predictions
    fig = Figure(figsize=(8.0, 1.2 + 0.55 * len(preds)), dpi=DPI)
    ax = fig.subplots()
    finite = [p.seconds_to_target for p in preds if math.isfinite(p.seconds_to_target)]
    right = max(finite) if finite else 1.0
    right += max((p.seconds_se for p in preds if p.seconds_se is not None
                  and math.isfinite(p.seconds_se) and math.isfinite(p.seconds_to_target)),
                 default=0.0)
    noted = False
    for y, p in enumerate(reversed(preds)):
        left = 0.0
        parts = components(p, a)
        for name, color in _PARTS.items():
            w = parts.get(name, 0.0)
            ax.barh(y, w, left=left, color=color, label=name if y == 0 else None)
            left += w
        se = p.seconds_se if p.seconds_se is not None and math.isfinite(p.seconds_se) else 0.0
        if parts and se > 0:  # the calibration's noise (model.Prediction.seconds_se)
            ax.errorbar(left, y, xerr=[[0.0], [se]], fmt="none", ecolor="#444444",
                        capsize=3, lw=1, label=None if noted else "+ SE (calibration)")
            left, noted = left + se, True
        if not parts:
            ax.text(0.01 * right, y, p.why[-1], va="center", fontsize=8)
        elif p.interval is not None:
            ax.text(left, y, f"  every {p.interval} it", va="center", fontsize=8)
    ax.set_yticks(range(len(preds)), [p.name for p in reversed(preds)])
    ax.set_xlim(0, right * 1.25)
    ax.set_xlabel(f"predicted time to target ({a.clock})")
    fig.suptitle(f"{a.workload} on {a.engine}, {a.trace}", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(handles),
                  bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def components(p: Prediction, a: Advice) -> dict[str, float]:
    """Predicted time to target split into its parts (they sum to it)."""
    if not math.isfinite(p.seconds_to_target) or p.failures is None:
        return {}
    work = a.baseline.seconds
    lost = p.per_failure_seconds or 0.0
    # The outage a failure adds, less than its recovery where recoveries overlap (advice
    # saved before it was kept: the recovery).
    rec = p.outage_seconds if p.outage_seconds is not None else (p.recovery_seconds or 0.0)
    return {"failure-free work": work, "checkpoints": work * p.steady,
            "recovering": p.failures * rec, "rework": p.failures * (lost - rec)}
