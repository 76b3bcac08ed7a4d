"""The suite report: ``results.csv`` -> summary tables, ``report.md``, ``report.html``, plots.

``report.html`` is rendered from the very markdown written to ``report.md`` (one
source, two views) by a small converter that knows the constructs this module
writes — headings, pipe tables, lists, fenced code, images — and embeds every image
as a data URI, so the HTML is one self-contained file with no external reference.
"""

from __future__ import annotations

import base64
import csv
import html
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainthrough._atomic import atomic_write
from trainthrough.errors import UserError
from trainthrough.lab.plots import curves_filename, plot_metric_curves, plot_rework_bars
from trainthrough.lab.recorder import complete

_TEXT = frozenset({"run_id", "workload", "strategy", "fail", "metric_name", "direction",
                   "engine", "spec"})
_MEANS = ("checkpoint_bytes", "checkpoint_blocked_seconds", "recovery_seconds",
          "perturbation_norm", "rework_bound", "updates_lost", "sim_seconds", "wall_seconds")
_STATS = frozenset({"n", "converged", "rework_n", "rework_mean", "rework_sd",
                    "reduction_vs_baseline", "rework_lo", "rework_hi", "reduction_lo",
                    "reduction_hi", "reduction_pairs", *(f"{c}_mean" for c in _MEANS)})
_NA = "n/a"


def _parse(key: str, cell: str | None) -> Any:
    s = (cell or "").strip()
    if not s:
        return None
    if key in _TEXT:  # "none" is a strategy name and "0001" a run id: keep text as is
        return s
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    if s.lower() in ("none", "null", "nan"):
        return None
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def load_results(suite_dir: Path) -> list[dict[str, Any]]:
    """Rows of ``suite_dir/results.csv``, numbers and booleans parsed, empty cells None.

    Raises:
        UserError: the file is missing or unreadable.
    """
    path = Path(suite_dir) / "results.csv"
    try:
        with open(path, newline="") as f:
            return [{k: _parse(k, v) for k, v in row.items() if k} for row in csv.DictReader(f)]
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} ({e}); point at a suite folder written by "
                        "`trainthrough compare`") from e


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def summarize(rows: Sequence[dict[str, Any]], by: Sequence[str] = ("workload", "fail", "strategy"),
              baseline_strategy: str = "checkpoint-restart",
              intervals: bool = False) -> list[dict[str, Any]]:
    """Aggregate runs per group (groups in order of first appearance).

    Each result holds the ``by`` keys, ``n``, ``converged`` (count), ``rework_n``,
    ``rework_mean`` and ``rework_sd`` (sample sd, None under two values; over runs
    whose rework is defined), ``reduction_vs_baseline`` (``1 - rework_mean /
    rework_mean`` of ``baseline_strategy`` in the group with the same other keys;
    None if absent, undefined or its mean <= 0) and ``<column>_mean`` for
    checkpoint bytes/blocking, recovery seconds, perturbation norm, rework bound,
    updates lost, sim and wall seconds (None where no run has a value).

    With ``intervals``, 95% intervals of the mean rework and of the reduction (paired
    by seed; the reduction is then computed over the paired seeds): see
    :func:`trainthrough.lab.intervals.add_intervals`.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    out: list[dict[str, Any]] = []
    for key, members in groups.items():
        rework = [v for r in members if (v := _num(r.get("rework_iterations"))) is not None]
        s: dict[str, Any] = dict(zip(by, key, strict=True))
        s.update(n=len(members), converged=sum(r.get("converged") is True for r in members),
                 rework_n=len(rework), rework_mean=_mean(rework),
                 rework_sd=statistics.stdev(rework) if len(rework) > 1 else None,
                 reduction_vs_baseline=None)
        for c in _MEANS:
            s[f"{c}_mean"] = _mean([v for r in members if (v := _num(r.get(c))) is not None])
        out.append(s)
    if "strategy" in by:
        i = list(by).index("strategy")
        base = {k[:i] + k[i + 1:]: s["rework_mean"] for k, s in zip(groups, out, strict=True)
                if k[i] == baseline_strategy}
        for k, s in zip(groups, out, strict=True):
            b, m = base.get(k[:i] + k[i + 1:]), s["rework_mean"]
            if b is not None and b > 0 and m is not None:
                s["reduction_vs_baseline"] = 1.0 - m / b
    if intervals:
        from trainthrough.lab.intervals import add_intervals

        add_intervals(out, list(groups.values()), by, baseline_strategy)
    return out


def _f(v: Any, scale: float = 1.0) -> str:
    x = _num(v)
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
        return f"{100 * r:.1f}% " + _bounds(s["reduction_lo"], s["reduction_hi"], 100.0, "%")
    return f"{100 * r:.1f}%"


_OPTIONAL = (("rework_bound", "bound"), ("perturbation_norm", "‖δ‖"),
             ("recovery_seconds", "recovery s"), ("checkpoint_bytes", "ckpt MB"),
             ("checkpoint_blocked_seconds", "blocked s"), ("updates_lost", "updates lost"),
             ("sim_seconds", "sim s"), ("wall_seconds", "wall s"))


def _columns(rows: Sequence[dict[str, Any]], baseline: str, full: bool
             ) -> list[tuple[str, str]]:
    """(header, field) pairs; optional columns only when some group has a value."""
    keys = [k for k in (rows[0] if rows else {}) if k not in _STATS]
    cols = [("failures" if k == "fail" else k, k) for k in keys]
    ci = bool(rows) and "rework_lo" in rows[0]
    cols += [("runs", "n"), ("converged", "converged"),
             ("rework (mean [95% CI])" if ci else "rework (mean ± sd)", "rework_mean"),
             (f"reduction vs {baseline}" + (" [95% CI]" if ci else ""),
              "reduction_vs_baseline")]
    brief = {"recovery_seconds", "sim_seconds", "wall_seconds"}
    cols += [(head, f"{c}_mean") for c, head in _OPTIONAL if (full or c in brief)
             and any(s.get(f"{c}_mean") is not None for s in rows)]
    return cols


def _cell(s: dict[str, Any], field: str, baseline: str) -> str:
    if field not in _STATS:
        return _label(s.get(field))
    if field == "n":  # a count: "10", not _f's "10.0"
        return str(s["n"])
    if field == "converged":
        return f"{s['converged']}/{s['n']}"
    if field == "rework_mean":
        return _rework(s)
    if field == "reduction_vs_baseline":
        return _reduction(s, baseline)
    return _f(s.get(field), 1e-6 if field == "checkpoint_bytes_mean" else 1.0)


def headline_table(summary_rows: Sequence[dict[str, Any]],
                   baseline_strategy: str = "checkpoint-restart") -> str:
    """A fixed-width plain-text table of the summary, for the terminal."""
    cols = _columns(summary_rows, baseline_strategy, full=False)
    cells = [[h for h, _ in cols]] + [[_cell(s, f, baseline_strategy) for _, f in cols]
                                      for s in summary_rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) if f in _STATS else c.ljust(w)
                       for c, w, (_, f) in zip(r, widths, cols, strict=True)).rstrip()
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md_cell(text: str, code: bool = False) -> str:
    text = text.replace("|", "\\|")
    return f"`{text}`" if code and text not in ("", "none", _NA) else text


def _md_table(headers: list[str], rows: list[list[str]], right: list[bool]) -> str:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _summary_md(summary: list[dict[str, Any]], baseline: str) -> str:
    cols = _columns(summary, baseline, full=True)
    body = [[_md_cell(_cell(s, f, baseline), code=f == "fail") for _, f in cols]
            for s in summary]
    return _md_table([h for h, _ in cols], body, [f in _STATS for _, f in cols])


def _runs_md(rows: list[dict[str, Any]]) -> str:
    keys = ["run_id", "workload", "fail", "strategy", "seed", "converged",
            "iterations_to_target", "rework_iterations", "failures", "final_metric"]
    body = [[_md_cell(_NA if r.get(k) is None else
                      _f(r[k]) if isinstance(r[k], float) else str(r[k]), code=k == "fail")
             for k in keys] for r in rows]
    return _md_table([k.replace("_", " ") for k in keys], body,
                     [k not in ("run_id", "workload", "fail", "strategy") for k in keys])


def _auto_notes(suite_dir: Path, rows: list[dict[str, Any]], baseline: str) -> list[str]:
    notes = []
    if not rows:
        notes.append("results.csv holds no runs.")
    missing = [str(r.get("run_id")) for r in rows
               if not complete(suite_dir / "runs" / str(r.get("run_id")))]
    if missing:
        notes.append(f"{len(missing)} run folder(s) missing or incomplete (no summary.json), "
                     f"left out of the curves: {', '.join(missing)}.")
    failed = sum(r.get("rework_iterations") is None for r in rows)
    if failed:
        notes.append(f"{failed} of {len(rows)} runs have no rework (a run did not reach the "
                     "target); rework is averaged over the runs that have one.")
    if rows and not any(r.get("strategy") == baseline for r in rows):
        notes.append(f"no {baseline} runs: the reduction column is empty.")
    return notes


def write_report(suite_dir: Path, title: str, notes: list[str] | None = None,
                 extra_sections: list[tuple[str, str]] | None = None,
                 by: Sequence[str] = ("workload", "fail", "strategy"),
                 baseline_strategy: str = "checkpoint-restart",
                 intervals: bool = False) -> dict[str, Path]:
    """Write ``report.md``, ``report.html`` and the PNG plots (under ``plots/``).

    Args:
        suite_dir: the suite folder (``results.csv``, ``runs/<run_id>/``).
        title: the report's title.
        notes: lines shown under the title (notes on missing runs are added).
        extra_sections: ``(heading, markdown body)`` pairs appended to the report.
        by, baseline_strategy, intervals: grouping, baseline and 95% intervals of the
            summary (see :func:`summarize`).

    Returns:
        ``{"markdown": ..., "html": ..., "rework": ..., "<png stem>": ...}``.

    Raises:
        UserError: ``results.csv`` is missing or unreadable.
    """
    suite_dir = Path(suite_dir)
    baseline = baseline_strategy
    rows = load_results(suite_dir)
    summary = summarize(rows, by=by, baseline_strategy=baseline, intervals=intervals)
    plots = suite_dir / "plots"
    bars = plot_rework_bars(summary, plots / "rework.png", baseline)
    curves = plot_metric_curves(suite_dir, rows, plots)
    md = [f"# {title}", ""]
    md += [f"- {n}" for n in [*(notes or []), *_auto_notes(suite_dir, rows, baseline)]]
    how = (f"mean and 95% t interval over runs that reached it). *Reduction vs {baseline}*: "
           f"1 − mean rework / mean rework of {baseline} under the same failures, over the "
           "seeds both reached the target with, and its 95% Fieller interval paired by seed "
           "(lab/intervals.py says why; *unbounded*: the baseline's own rework is not "
           "clearly above 0)" if intervals else
           f"mean ± sd over runs that reached it). *Reduction vs {baseline}*: "
           f"1 − mean rework / mean rework of {baseline} under the same failures")
    md += ["", "## Summary", "",
           "Rework: extra iterations to reach the target compared with the failure-free run "
           f"of the same seed ({how}.", "",
           _summary_md(summary, baseline), "", "## Plots", "",
           f"![rework iterations per strategy]({bars.relative_to(suite_dir).as_posix()})", ""]
    for workload, fail in dict.fromkeys((r.get("workload"), r.get("fail")) for r in rows):
        png = plots / curves_filename(str(workload), fail)
        if png in curves:
            md += [f"### {workload} — failures: {_md_cell(str(fail or 'none'), True)}", "",
                   f"![{workload} {fail or 'none'}]({png.relative_to(suite_dir).as_posix()})", ""]
    for heading, body in extra_sections or []:
        md += [f"## {heading}", "", body.strip(), ""]
    if rows:
        md += ["## Runs", "", _runs_md(rows), ""]
    text = "\n".join(md)
    written = {"markdown": suite_dir / "report.md", "html": suite_dir / "report.html"}
    atomic_write(written["markdown"], text, encoding="utf-8")
    atomic_write(written["html"], _html_page(title, _md_to_html(text, suite_dir)),
                 encoding="utf-8")
    written.update({p.stem: p for p in [bars, *curves]})
    return written


# -- markdown -> HTML (only what the reports contain) ---------------------------------

_CSS = """body{font:15px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1150px;
margin:2em auto;padding:0 1em;color:#222}h1,h2,h3{line-height:1.2}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px}th{background:#f0f0f0}
tr:nth-child(even) td{background:#fafafa}td.r,th.r{text-align:right}
code{background:#f3f3f3;padding:0 3px;border-radius:3px}pre{background:#f6f6f6;padding:.8em;
overflow:auto}img{max-width:100%;height:auto;display:block;margin:.5em 0}"""
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}


def _html_page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def _inline(text: str, base: Path) -> str:
    def image(m: re.Match[str]) -> str:
        alt, src = m.group(1), html.unescape(m.group(2))
        p = base / src
        if "://" in src or p.suffix.lower() not in _MIME or not p.is_file():
            return f"<em>[image not available: {alt}]</em>"
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        return f'<img alt="{alt}" src="data:{_MIME[p.suffix.lower()]};base64,{data}">'

    def link(m: re.Match[str]) -> str:  # no external references: a remote URL stays text
        if "://" in m.group(2) or m.group(2).startswith("//"):
            return f"{m.group(1)} ({m.group(2)})"
        return f'<a href="{m.group(2)}">{m.group(1)}</a>'

    parts = re.split(r"(`[^`]+`)", text)
    for i, part in enumerate(parts):
        if i % 2:
            parts[i] = f"<code>{html.escape(part[1:-1])}</code>"
            continue
        s = html.escape(part, quote=True)
        s = re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", image, s)
        s = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", link, s)
        s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
        parts[i] = re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"<em>\1</em>", s)
    return "".join(parts)


def _cells(line: str) -> list[str]:
    s = line.strip()
    s = s[1:] if s.startswith("|") else s
    s = s[:-1] if s.endswith("|") and not s.endswith("\\|") else s
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", s)]


def _table_html(lines: list[str], base: Path) -> str:
    head, rows = _cells(lines[0]), [_cells(ln) for ln in lines[2:]]
    right = [c.endswith(":") and not c.startswith(":") for c in _cells(lines[1])]

    def tr(cells: list[str], tag: str) -> str:
        return "<tr>" + "".join(
            f'<{tag}{" class=r" if i < len(right) and right[i] else ""}>{_inline(c, base)}</{tag}>'
            for i, c in enumerate(cells)) + "</tr>"
    return ("<table><thead>" + tr(head, "th") + "</thead><tbody>\n"
            + "\n".join(tr(r, "td") for r in rows) + "\n</tbody></table>")


def _md_to_html(md: str, base: Path) -> str:
    """Headings, pipe tables, ``-``/``*`` lists, fenced code, paragraphs, inline code,
    emphasis, images (embedded) and links (local only)."""
    lines, i = md.splitlines(), 0
    out: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(para), base)}</p>")
            para.clear()
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("```"):
            flush()
            j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("```")),
                     len(lines))
            out.append(f"<pre><code>{html.escape(chr(10).join(lines[i + 1:j]))}</code></pre>")
            i = j + 1
            continue
        if (h := re.match(r"(#{1,6})\s+(.*)", ln)):
            flush()
            out.append(f"<h{len(h[1])}>{_inline(h[2], base)}</h{len(h[1])}>")
        elif ln.lstrip().startswith("|") and i + 1 < len(lines) and re.match(
                r"\s*\|?\s*:?-{3,}", lines[i + 1]):
            flush()
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out.append(_table_html(lines[i:j], base))
            i = j
            continue
        elif re.match(r"\s*[-*]\s+", ln):
            flush()
            items = []
            while i < len(lines) and (m := re.match(r"\s*[-*]\s+(.*)", lines[i])):
                items.append(f"<li>{_inline(m[1], base)}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif not ln.strip():
            flush()
        else:
            para.append(ln.strip())
        i += 1
    flush()
    return "\n".join(out)
