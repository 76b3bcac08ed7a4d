"""The TTF suite's plot: accuracy vs wall-clock time, one line per strategy, downtime shaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from trainthrough.lab.plots import DPI, FIGSIZE, strategy_colors
from trainthrough.lab.recorder import complete


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def plot_accuracy_vs_time(suite_dir: Path, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per scenario; the first repetition of each strategy is drawn.

    Shaded spans run from each kill to the moment the shard (or the promoted head)
    applied its next update.
    """
    out.mkdir(parents=True, exist_ok=True)
    colors = strategy_colors(r["strategy"] for r in rows)
    paths = []
    for scen in dict.fromkeys(r["scenario"] for r in rows):
        fig = Figure(figsize=FIGSIZE, dpi=DPI)
        ax = fig.subplots()
        drawn: set[str] = set()
        for r in [r for r in rows if r["scenario"] == scen]:
            run = suite_dir / "runs" / r["run_id"]
            if r["strategy"] in drawn or not complete(run):  # half a run is not drawn
                continue
            drawn.add(r["strategy"])
            m = _jsonl(run / "metrics.jsonl")
            ax.plot([x["wall_seconds"] for x in m], [x["metric"] for x in m],
                    color=colors[r["strategy"]], label=r["strategy"], lw=1.4)
            events = _jsonl(run / "events.jsonl")
            kills = [e["wall_seconds"] for e in events if e["type"] == "failure"]
            ends = [e["wall_seconds"] for e in events if e["type"] == "recovery"]
            for k in kills:
                end = min([e for e in ends if e >= k], default=k)
                ax.axvspan(k, max(end, k + 0.05), color=colors[r["strategy"]], alpha=0.12)
        target = next((r.get("target") for r in rows if r.get("target") is not None), None)
        if target is not None:
            ax.axhline(target, color="0.3", ls=":", lw=1, label=f"target {target:g}")
        ax.set_title(f"accuracy vs wall-clock time: PS killed {scen} (shaded: down until the "
                     "next applied update)", fontsize=9)
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        p = out / f"ttf-accuracy-{scen}.png"
        fig.savefig(p)
        paths.append(p)
    return paths
