"""``report.html``: the report's markdown as one self-contained HTML page.

The page is rendered from the very markdown written to ``report.md`` (one source, two
views) by markdown-it-py: CommonMark plus pipe tables. It references nothing outside
itself, so it can be mailed or attached as one file:

* a local image (PNG, JPEG, SVG; its path relative to the report's folder) is embedded
  as a data URI; any other image becomes a note, ``[image not available: <alt>]``;
* a link to a remote URL is shown as its text with the URL after it, not as a link
  (local links stay links);
* raw HTML in the markdown (notes and extra sections come from suite definitions) is
  shown as text, not passed through.
"""

from __future__ import annotations

import base64
import html
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import OptionsDict

_CSS = """body{font:15px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1150px;
margin:2em auto;padding:0 1em;color:#222}h1,h2,h3{line-height:1.2}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px}th{background:#f0f0f0}
tr:nth-child(even) td{background:#fafafa}
code{background:#f3f3f3;padding:0 3px;border-radius:3px}pre{background:#f6f6f6;padding:.8em;
overflow:auto}img{max-width:100%;height:auto;display:block;margin:.5em 0}"""
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}

_Env = MutableMapping[str, Any]


def _remote(url: str) -> bool:
    return "://" in url or url.startswith("//")


def _image(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
           env: _Env) -> str:
    token = tokens[idx]
    alt = html.escape(self.renderInlineAsText(token.children or [], options, env))
    # markdown-it percent-encodes the destination; the file has the name as written
    src = unquote(str(token.attrGet("src") or ""))
    path = Path(env["base"]) / src
    mime = _MIME.get(path.suffix.lower())
    if _remote(src) or mime is None or not path.is_file():
        return f"<em>[image not available: {alt}]</em>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{alt}" src="data:{mime};base64,{data}">'


def _link_open(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
               env: _Env) -> str:
    href = str(tokens[idx].attrGet("href") or "")
    # link_close has no href: it finds the remote one (or None) here, links never nest
    env.setdefault("links", []).append(href if _remote(href) else None)
    return "" if _remote(href) else self.renderToken(tokens, idx, options, env)


def _link_close(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
                env: _Env) -> str:
    href = env["links"].pop()
    if href is None:
        return self.renderToken(tokens, idx, options, env)
    # an autolink's text is its URL already
    return "" if tokens[idx].markup == "autolink" else f" ({html.escape(href)})"


# "gfm-like" would add tables too, but needs linkify-it-py and passes raw HTML through.
_MD = MarkdownIt("commonmark", {"html": False}).enable("table")
_MD.add_render_rule("image", _image)
_MD.add_render_rule("link_open", _link_open)
_MD.add_render_rule("link_close", _link_close)


def html_page(title: str, markdown: str, base: Path) -> str:
    """The HTML page of ``markdown``, titled ``title``, its images read under ``base``."""
    body = _MD.render(markdown, {"base": Path(base)}).rstrip("\n")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")
