"""``report.html``: the report's markdown as one self-contained HTML page.

The page is rendered from the very markdown written to ``report.md`` (one source, two
views) by a small converter that knows the constructs the report writes — headings,
pipe tables, lists, fenced code, images — and embeds every image as a data URI, so the
HTML is one file with no external reference.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

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


def html_page(title: str, markdown: str, base: Path) -> str:
    """The HTML page of ``markdown``, titled ``title``, its images read under ``base``."""
    return _html_page(title, _md_to_html(markdown, base))
