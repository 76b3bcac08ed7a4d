"""Running a suite: a grid of runs sharing failure-free baselines, then the report.

A suite is code that returns a :class:`SuiteSpec` (a list of run configs with their
labels); this module runs them in up to two processes at a time (never more than the
machine's cores; each run is single-threaded and deterministic, so the order of
completion changes nothing), and writes ``results.csv``, ``report.md``, ``report.html`` and plots.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainthrough._atomic import atomic_open
from trainthrough.config import RunConfig, baseline_config
from trainthrough.errors import UserError
from trainthrough.lab.jobs import job_pool
from trainthrough.lab.progress import console, make_progress
from trainthrough.lab.validate import validate_run

if TYPE_CHECKING:
    from trainthrough.engines.result import RunSummary
    from trainthrough.lab.rework import Baseline


@dataclass
class SuiteRun:
    """One cell of the grid: an id, a config, and labels that become CSV columns."""

    run_id: str
    config: RunConfig
    labels: dict[str, Any] = field(default_factory=dict)


@dataclass
class SuiteSpec:
    """What a suite runs and how its report is titled."""

    name: str
    title: str
    runs: list[SuiteRun]
    notes: list[str] = field(default_factory=list)
    group_by: tuple[str, ...] = ("workload", "fail", "strategy")
    baseline_strategy: str = "checkpoint-restart"
    sections: list[Any] = field(default_factory=list)  # callables(suite_dir, rows) -> (h, md)
    jobs: int | None = None  # 1 for suites whose runs use the whole machine (Ray)
    baselines: bool = True  # failure-free twins for rework (sim suites)
    headline: Any = None  # callable(rows) -> str replacing the default terminal table
    intervals: bool = False  # 95% intervals of rework and reductions (lab/intervals.py)
    # callable(RunConfig) -> RunConfig: the failure-free twin, where several cells share
    # one (e.g. strategies that only differ in what they do on a failure)
    baseline_of: Any = None


# The runner is imported where a run starts: it imports the engines and torch, which a
# suite's spec, and the CLI's parser that lists the suites, do not need.
def _baseline_job(cfg: RunConfig) -> Baseline:
    from trainthrough.lab.runner import run_baseline

    return run_baseline(cfg)


def _run_job(cfg: RunConfig, out: str, baseline: Baseline | None) -> RunSummary:
    from trainthrough.lab.runner import run

    return run(cfg, Path(out), baseline=baseline)


def flatten(summary: RunSummary, labels: dict[str, Any], run_id: str) -> dict[str, Any]:
    """One CSV row: labels, the scalar fields of ``summary.json``, and sums over
    recoveries."""
    row: dict[str, Any] = {"run_id": run_id, **labels}
    recs = summary.result.recoveries
    for k, v in summary.to_dict().items():
        if k == "recoveries":
            row["recovery_count"] = len(recs)
            row["perturbation_norm"] = sum(r.perturbation_norm for r in recs) if recs else None
            row["recovery_seconds"] = sum(r.recovery_seconds for r in recs) if recs else None
        elif not isinstance(v, dict | list):
            row.setdefault(k, v)
    return row


def run_suite(spec: SuiteSpec, out: Path, quiet: bool = False, jobs: int | None = None) -> str:
    """Run every cell of ``spec`` into ``out`` and write the report; return the headline.

    Raises:
        UserError: an invalid config in the grid, or ``out`` already in use.
    """
    for r in spec.runs:
        validate_run(r.config)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"suite folder {out} already exists and is not empty; "
                        "choose another --out or remove it")
    jobs = jobs or spec.jobs or min(2, os.cpu_count() or 1)
    from trainthrough.engines.registry import traits  # here: the parser imports suites

    uses_ray = any(traits(r.config.engine).on_ray for r in spec.runs)
    started = False
    if uses_ray:
        from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray

        started = ensure_ray(spec.runs[0].config.ray_address)
    try:
        return _run_all(spec, out, quiet, jobs)
    finally:
        if uses_ray and started:
            shutdown_ray()


def _run_all(spec: SuiteSpec, out: Path, quiet: bool, jobs: int) -> str:
    from trainthrough.lab.report import headline_table, load_results, summarize, write_report

    twin = spec.baseline_of or baseline_config
    keys = {r.run_id: twin(r.config).to_toml() for r in spec.runs}
    unique = {k: twin(r.config) for r in spec.runs for k in [keys[r.run_id]]}
    baselines: dict[str, Baseline] = {}
    rows: list[dict[str, Any]] = []
    with make_progress(quiet) as progress, job_pool(jobs) as pool:
        if spec.baselines:
            task = progress.add_task(f"{spec.name}: baselines", total=len(unique), status="")
            futs = {k: pool.submit(_baseline_job, c) for k, c in unique.items()}
            for k, f in futs.items():
                baselines[k] = f.result()
                progress.advance(task)
        task = progress.add_task(f"{spec.name}: runs", total=len(spec.runs), status="")
        run_futs = [(r, pool.submit(_run_job, r.config, str(out / "runs" / r.run_id),
                                    baselines.get(keys[r.run_id]))) for r in spec.runs]
        for r, job in run_futs:
            rows.append(flatten(job.result(), r.labels, r.run_id))
            progress.advance(task)
            progress.update(task, status=r.run_id)
    _write_csv(out / "results.csv", rows)
    results = load_results(out)
    summary_rows = summarize(results, by=spec.group_by, baseline_strategy=spec.baseline_strategy,
                             intervals=spec.intervals)
    sections = [section(out, results) for section in spec.sections]
    write_report(out, spec.title, spec.notes, extra_sections=sections, by=spec.group_by,
                 baseline_strategy=spec.baseline_strategy, intervals=spec.intervals)
    if not quiet:
        console.print(f"[dim]{len(rows)} runs in {out}[/dim]")
    if spec.headline is not None:
        return str(spec.headline(results))
    return headline_table(summary_rows, spec.baseline_strategy)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows with the union of their keys; atomically, so a partial CSV never shows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with atomic_open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
