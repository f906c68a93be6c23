"""A report as a list of blocks (headings, text, tables, images), rendered once to Markdown and once to HTML."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.report.text import markdown_table


@dataclass
class Block:
    """One piece of the report, rendered to both Markdown and HTML."""

    kind: str  # "heading" | "text" | "table" | "image" | "code" | "toc"
    text: str = ""
    level: int = 2
    headers: list[str] | None = None
    rows: list[list[str]] | None = None
    best: set[tuple[int, int]] = field(default_factory=set)  # (row, column) of highlighted cells
    caption: str = ""  # under an image, above a table


def _headings(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.kind == "heading" and b.level in (2, 3)]


def render_markdown(blocks: list[Block]) -> str:
    parts = []
    for block in blocks:
        if block.kind == "heading":
            parts.append(f"{'#' * block.level} {block.text}")
        elif block.kind == "text":
            parts.append(block.text)
        elif block.kind == "toc":
            parts.append(
                "\n".join(
                    f"{'  ' * (h.level - 2)}- [{h.text}](#{_slug(h.text)})" for h in _headings(blocks) if h.level == 2
                )
            )
        elif block.kind == "code":
            parts.append(f"```toml\n{block.text.rstrip()}\n```")
        elif block.kind == "table":
            rows = [
                [f"**{c}**" if (i, j) in block.best and c else c for j, c in enumerate(row)]
                for i, row in enumerate(block.rows)
            ]
            parts += ([block.caption] if block.caption else []) + [markdown_table(block.headers, rows)]
        else:
            alt = Path(block.text).stem.rsplit("-", 1)[-1]  # speedup, time, memory, error, N1024 (a Pareto chart)
            parts.append(f"![{alt}]({block.text})" + (f"\n\n*{block.caption}*" if block.caption else ""))
    return "\n\n".join(parts) + "\n"


# Phone first: text wraps to the screen, wide tables scroll sideways under a fixed first column, plots fill the
# width (their fonts are sized for that, see attnbench.report.plots) and open at full size on a tap; wide screens show
# plots two to a row.
HTML_STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;color:#222;
line-height:1.45;overflow-wrap:break-word;-webkit-text-size-adjust:100%}h1{font-size:1.6em}
h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}h3{margin-top:1.6em}
.scroll{overflow-x:auto;margin:0 0 1.4em;max-width:100%}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left;position:sticky;left:0;background:#fff}
th{background:#f3f3f3;position:sticky;top:0}th:first-child{background:#f3f3f3;z-index:1}
td.best{background:#e3f2e1;font-weight:600}
.caption{font-size:13px;color:#444;margin:0.8em 0 6px;max-width:60em}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,460px),1fr));gap:0 28px}
figure{margin:0.6em 0 1.8em;min-width:0}figure label{display:block;overflow-x:auto;cursor:zoom-in}
figure input{position:absolute;opacity:0;pointer-events:none}
figure img{width:100%;height:auto;display:block;border:1px solid #eee;box-sizing:border-box}
figure input:checked+img{width:auto;max-width:none;cursor:zoom-out}figure:has(input:checked){grid-column:1/-1}
figcaption{font-size:13px;color:#444;margin-top:4px}code{background:#f3f3f3;padding:0 3px;border-radius:3px;
overflow-wrap:anywhere}td.text,th.text{text-align:left}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}nav{background:#fafafa;border:1px solid #eee;
padding:6px 12px;font-size:14px}nav ul{margin:4px 0;padding-left:1.2em}
@media (max-width:600px){body{padding:0 10px;margin:1em auto}h1{font-size:1.35em}h2{font-size:1.25em}
h3{font-size:1.05em}table{font-size:12px}td,th{padding:3px 6px}}"""


def inline_html(text: str) -> str:
    """Escaped text with `code spans` and **strong** runs rendered."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def _is_text_column(cells: list[str]) -> bool:
    """A column of names or reasons (left-aligned), not of figures: some cell starts with a letter."""
    return any(cell[:1].isalpha() and not cell.startswith(("ok", "nan")) for cell in cells if cell)


def _toc_html(blocks: list[Block]) -> str:
    """Nested links: each level-2 heading with its level-3 headings under it."""
    out, started, in_sub = "<ul>", False, False
    for heading in _headings(blocks):
        link = f"<a href='#{_slug(heading.text)}'>{inline_html(heading.text)}</a>"
        if heading.level == 2:
            out += ("</ul>" if in_sub else "") + ("</li>" if started else "") + f"<li>{link}"
            started, in_sub = True, False
        else:
            out += ("" if in_sub else "<ul>") + f"<li>{link}</li>"
            in_sub = True
    return out + ("</ul>" if in_sub else "") + ("</li>" if started else "") + "</ul>"


def _text_html(text: str) -> str:
    """A text block's paragraphs (apart by a blank line) as HTML, one whose every line starts '- ' as a list, as its
    Markdown renders."""
    parts = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.splitlines()
        if lines and all(line.startswith("- ") for line in lines):
            parts.append("<ul>" + "".join(f"<li>{inline_html(line[2:])}</li>" for line in lines) + "</ul>")
        else:
            parts.append(f"<p>{inline_html(paragraph)}</p>")
    return "\n".join(parts)


def render_html(blocks: list[Block], run_dir: Path) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>attnbench report: {html.escape(run_dir.name)}</title><style>{HTML_STYLE}</style></head><body>"
    ]
    in_plots = False  # inside a grid of consecutive plots
    for block in blocks:
        if in_plots and block.kind != "image":
            parts.append("</div>")
        if block.kind == "heading":
            level = block.level
            parts.append(f"<h{level} id='{_slug(block.text)}'>{inline_html(block.text)}</h{level}>")
        elif block.kind == "text":
            parts.append(_text_html(block.text))
        elif block.kind == "toc":
            parts.append(f"<nav><strong>Contents</strong>{_toc_html(blocks)}</nav>")
        elif block.kind == "code":
            parts.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif block.kind == "table":
            caption = f"<p class='caption'>{inline_html(block.caption)}</p>" if block.caption else ""
            text = [_is_text_column([row[j] for row in block.rows]) for j in range(len(block.headers))]
            head = "".join(
                f"<th{' class=text' if text[j] else ''}>{inline_html(h)}</th>" for j, h in enumerate(block.headers)
            )
            body = "".join(
                "<tr>"
                + "".join(
                    f"<td class='{'best ' if (i, j) in block.best else ''}{'text' if text[j] else ''}'>"
                    f"{inline_html(c)}</td>"
                    for j, c in enumerate(row)
                )
                + "</tr>"
                for i, row in enumerate(block.rows)
            )
            parts.append(
                f"{caption}<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
            )
        else:
            if not in_plots:
                parts.append("<div class='plots'>")
            data = base64.b64encode((run_dir / block.text).read_bytes()).decode()
            caption = f"<figcaption>{inline_html(block.caption)}</figcaption>" if block.caption else ""
            parts.append(
                f"<figure><label title='tap for full size'><input type='checkbox'>"
                f"<img alt='{html.escape(block.caption or Path(block.text).stem)}' "
                f"src='data:image/png;base64,{data}'></label>{caption}</figure>"
            )
        in_plots = block.kind == "image"
    parts.append("</div></body></html>" if in_plots else "</body></html>")
    return "\n".join(parts)


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()
