"""Tests for the suite report: tables, markdown, self-contained HTML and PNG plots."""

from __future__ import annotations

import csv
import json
import math
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from trainthrough.errors import UserError
from trainthrough.lab.plots import (
    curves_filename,
    plot_metric_curves,
    plot_rework_bars,
    safe_name,
    strategy_colors,
)
from trainthrough.lab.report import headline_table, load_results, summarize, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAIL = "shard0@20"
# (workload, strategy) -> rework per seed (None: the run did not reach the target).
REWORK: dict[tuple[str, str], list[int | None]] = {
    ("mlr", "checkpoint-restart"): [40, 60],   # mean 50, sd sqrt(200)
    ("mlr", "scar-partial"): [10, 20],         # mean 15 -> 70.0% less than 50
    ("mf", "checkpoint-restart"): [30, 50],    # mean 40
    ("mf", "scar-partial"): [10, None],        # mean 10 over one run -> 75.0%
}
FIELDS = ["run_id", "workload", "strategy", "fail", "seed", "converged", "iterations",
          "iterations_to_target", "baseline_iterations_to_target", "rework_iterations",
          "failures", "checkpoint_bytes", "checkpoint_blocked_seconds", "updates_applied",
          "updates_lost", "sim_seconds", "wall_seconds", "final_metric", "metric_name",
          "direction", "target", "perturbation_norm", "recovery_seconds", "fraction"]


def _row(run_id: str, workload: str, strategy: str, seed: int, rework: int | None,
         fail: str = FAIL) -> dict[str, Any]:
    base = 100
    return {"run_id": run_id, "workload": workload, "strategy": strategy, "fail": fail,
            "seed": seed, "converged": rework is not None, "iterations": 200,
            "iterations_to_target": "" if rework is None else base + rework,
            "baseline_iterations_to_target": base,
            "rework_iterations": "" if rework is None else rework,
            "failures": 1 if fail else 0, "checkpoint_bytes": 2_000_000,
            "checkpoint_blocked_seconds": 0.5, "updates_applied": 800, "updates_lost": 4,
            "sim_seconds": 12.5, "wall_seconds": 0.25, "final_metric": 0.9,
            "metric_name": "accuracy", "direction": "max", "target": 0.9,
            "perturbation_norm": 3.0 if fail else "", "recovery_seconds": 1.5 if fail else "",
            "fraction": ""}


def _write_run(suite: Path, run_id: str, rework: int | None, fail: bool = True) -> None:
    d = suite / "runs" / run_id
    d.mkdir(parents=True)
    end = 200 if rework is None else 100 + rework
    with open(d / "metrics.jsonl", "w") as f:
        for it in range(0, end + 1, 10):
            metric = min(0.95, 0.5 + 0.4 * it / end) if rework is not None else 0.5 + 0.1 * it / end
            f.write(json.dumps({"iteration": it, "sim_seconds": it * 0.1, "wall_seconds": it * 1e-3,
                                "metric": metric, "loss": 1 - metric, "extra": 1}) + "\n")
        f.write('{"iteration": 99')  # a torn last line must be skipped
    events = [{"type": "checkpoint", "iteration": 10, "sim_seconds": 1.0, "bytes": 10}]
    if fail:
        events += [{"type": "failure", "iteration": 20, "sim_seconds": 2.0, "kind": "shard"},
                   {"type": "detection", "iteration": 20, "sim_seconds": 2.1},
                   {"type": "recovery", "at_iteration": 20, "sim_seconds": 3.5,
                    "recovery_seconds": 1.5, "perturbation_norm": 3.0}]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (d / "summary.json").write_text("{}\n")  # a complete run (readers skip the others)


def _write_csv(suite: Path, rows: list[dict[str, Any]], fields: list[str] = FIELDS) -> None:
    suite.mkdir(parents=True, exist_ok=True)
    with open(suite / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    d = tmp_path / "suite"
    rows = []
    for (workload, strategy), reworks in REWORK.items():
        for seed, rework in enumerate(reworks):
            run_id = f"{workload}-{strategy}-{seed:04d}"
            rows.append(_row(run_id, workload, strategy, seed, rework))
            _write_run(d, run_id, rework)
    _write_csv(d, rows)
    return d


def test_load_results_parses_types(suite: Path) -> None:
    rows = load_results(suite)
    assert len(rows) == 8
    r = rows[0]
    assert r["run_id"] == "mlr-checkpoint-restart-0000" and r["fail"] == FAIL
    assert r["converged"] is True and r["seed"] == 0 and r["rework_iterations"] == 40
    assert isinstance(r["sim_seconds"], float) and r["fraction"] is None
    assert rows[-1]["converged"] is False and rows[-1]["rework_iterations"] is None


def test_load_results_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="results.csv"):
        load_results(tmp_path)


def test_summarize_known_numbers(suite: Path) -> None:
    summary = {(s["workload"], s["strategy"]): s for s in summarize(load_results(suite))}
    cr = summary[("mlr", "checkpoint-restart")]
    assert cr["n"] == 2 and cr["converged"] == 2 and cr["rework_n"] == 2
    assert cr["rework_mean"] == 50 and cr["rework_sd"] == pytest.approx(math.sqrt(200))
    assert cr["reduction_vs_baseline"] == pytest.approx(0.0)
    assert summary[("mlr", "scar-partial")]["reduction_vs_baseline"] == pytest.approx(0.7)
    partial = summary[("mf", "scar-partial")]
    assert partial["converged"] == 1 and partial["rework_n"] == 1
    assert partial["rework_mean"] == 10 and partial["rework_sd"] is None
    assert partial["reduction_vs_baseline"] == pytest.approx(0.75)
    assert cr["checkpoint_bytes_mean"] == 2_000_000 and cr["recovery_seconds_mean"] == 1.5
    assert cr["rework_bound_mean"] is None  # column absent from the CSV


def test_summarize_baseline_absent_or_zero() -> None:
    rows = [{"workload": "w", "fail": None, "strategy": s, "rework_iterations": v}
            for s, v in (("checkpoint-restart", 0), ("scar-partial", 0), ("chain-sync", 5))]
    assert all(s["reduction_vs_baseline"] is None for s in summarize(rows))
    only = summarize(rows[1:], baseline_strategy="nope")
    assert [s["reduction_vs_baseline"] for s in only] == [None, None]


def test_headline_table(suite: Path) -> None:
    table = headline_table(summarize(load_results(suite)))
    for name in ("mlr", "mf", "checkpoint-restart", "scar-partial", FAIL):
        assert name in table
    assert "70.0%" in table and "75.0%" in table and "50.0 ± 14.1" in table
    lines = table.splitlines()
    assert len(lines) == 2 + 4 and len({len(ln) for ln in lines[:2]}) == 1


def test_write_report(suite: Path) -> None:
    paths = write_report(suite, "Test suite", notes=["a note"],
                         extra_sections=[("Bound", "| a | b |\n|---|--:|\n| x | 1 |\n\ntext `c`")])
    md = paths["markdown"].read_text()
    page = paths["html"].read_text()
    pngs = [p for p in paths.values() if p.suffix == ".png"]
    assert len(pngs) == 3  # rework bars + one curve plot per workload
    for p in pngs:
        assert p.read_bytes().startswith(PNG_MAGIC)
    assert md.startswith("# Test suite") and "- a note" in md
    assert "1 of 8 runs did not reach the target" in md
    mlr_scar = next(ln for ln in md.splitlines()
                    if ln.startswith("| mlr | `shard0@20` | scar-partial"))
    assert "| 70.0% |" in mlr_scar
    assert "| 15.0 ± 7.1 |" in mlr_scar
    assert "| 75.0% |" in md and "## Bound" in md
    assert f"(plots/{curves_filename('mlr', FAIL)})" in md and "(plots/rework.png)" in md
    assert page.count("data:image/png;base64,") == 3
    assert 'src="http' not in page and "http://" not in page and "https://" not in page
    assert "<table>" in page and "<h2>Bound</h2>" in page and "<code>c</code>" in page
    assert "70.0%" in page


class _Page(HTMLParser):
    """The tables (rows of (tag, text) cells, alignment) and headings of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[tuple[str, str, bool]]]] = []
        self.headings: list[tuple[str, str]] = []
        self.tags: list[str] = []
        self._cell: tuple[str, bool] | None = None
        self._heading: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        right = any("right" in (v or "") for _, v in attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("th", "td"):
            self._cell, self._text = (tag, right), []
        elif tag in ("h1", "h2", "h3"):
            self._heading, self._text = tag, []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self._cell:
            self.tables[-1][-1].append((self._cell[0], "".join(self._text), self._cell[1]))
            self._cell = None
        elif tag == self._heading:
            self.headings.append((tag, "".join(self._text)))
            self._heading = None

    def handle_data(self, data: str) -> None:
        self._text.append(data)


def test_the_html_report_is_the_markdown_rendered(suite: Path) -> None:
    """report.html holds what report.md says, as HTML elements: pipe tables (alignment,
    escaped pipes, inline code in cells), headings, ordered lists; raw HTML is text and
    a remote image or link is no reference."""
    extra = ("| key | value |\n|---|---:|\n| `a\\|b` | 1 |\n| *c* | 2 |\n\n"
             "### Sub *heading*\n\n1. one\n2. two\n\n"
             "![far](https://example.com/x.png) [site](https://example.com/y)")
    paths = write_report(suite, "Report <1>", notes=["<script>alert(1)</script>"],
                         extra_sections=[("Extra", extra)])
    page = _Page()
    page.feed(paths["html"].read_text(encoding="utf-8"))
    assert ("h1", "Report <1>") in page.headings and ("h2", "Summary") in page.headings
    assert ("h2", "Extra") in page.headings and ("h3", "Sub heading") in page.headings
    assert "ol" in page.tags and "script" not in page.tags
    summary, extra_table = page.tables[0], page.tables[1]
    assert [c[1] for c in summary[0][:4]] == ["workload", "failures", "strategy", "runs"]
    assert all(tag == "th" for tag, _, _ in summary[0]) and len(summary) == 1 + 4
    mlr_scar = next(r for r in summary if [c[1] for c in r[:3]] == ["mlr", FAIL, "scar-partial"])
    assert ("td", "15.0 ± 7.1", True) in mlr_scar and ("td", "70.0%", True) in mlr_scar
    assert extra_table == [[("th", "key", False), ("th", "value", True)],
                           [("td", "a|b", False), ("td", "1", True)],
                           [("td", "c", False), ("td", "2", True)]]
    text = paths["html"].read_text(encoding="utf-8")
    assert "[image not available: far]" in text and "https://example.com/x" not in text
    assert 'href="https' not in text and "site (https://example.com/y)" in text
    assert "&lt;script&gt;" in text


def test_robust_suites(tmp_path: Path) -> None:
    # one run, no failures, not converged, plus a row whose folder is missing
    d = tmp_path / "s"
    _write_run(d, "r1", None, fail=False)
    _write_csv(d, [_row("r1", "mlr", "scar-partial", 0, None, fail=""),
                   _row("gone", "mlr", "scar-partial", 1, 5, fail="")],
               fields=[f for f in FIELDS if f not in ("fraction", "perturbation_norm")])
    paths = write_report(d, "Tiny")
    md = paths["markdown"].read_text()
    assert "left out of the curves: gone" in md and "no checkpoint-restart runs" in md
    assert all(p.is_file() for p in paths.values())
    # an empty suite still gives a report
    e = tmp_path / "empty"
    _write_csv(e, [])
    assert "holds no runs" in write_report(e, "Empty")["markdown"].read_text()


def test_plots_directly(suite: Path, tmp_path: Path) -> None:
    rows = load_results(suite)
    out = tmp_path / "p"
    curves = plot_metric_curves(suite, rows, out, x="sim_seconds")
    assert [p.name for p in curves] == [curves_filename(w, FAIL, "sim_seconds")
                                        for w in ("mlr", "mf")]
    bars = plot_rework_bars(summarize(rows), out)
    assert bars == out / "rework.png" and bars.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError):
        plot_metric_curves(suite, rows, out, x="epoch")


def test_names_and_colors() -> None:
    specs = ["shard0@100", "shard0=100", "worker1@50%,shard2@t=3.5", "a b/c"]
    names = [safe_name(s) for s in specs]
    assert len(set(names)) == len(names)
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
               for n in names)
    assert safe_name("plain-name") == "plain-name"
    a = strategy_colors(["x", "checkpoint-restart", "y"])
    b = strategy_colors(["checkpoint-restart", "x"])
    assert a["checkpoint-restart"] == b["checkpoint-restart"] and a["x"] == b["x"] != a["y"]
