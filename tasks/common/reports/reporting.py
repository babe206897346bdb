"""What the report and the workloads' own report sections share: cells, tables, sections and the page.

Table cells, tables with chosen columns, the sections a workload adds to the report
(tasks.workloads.Workload.report), and the report's Markdown as one HTML page with its figures inline."""

import re
from dataclasses import dataclass, field
from pathlib import Path


def fmt(value) -> str:
    """A table cell: '–' for nothing or NaN, integers as they are, other numbers to about three
    significant digits (no exponent below a million)."""
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 100:
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value:.3g}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def table_markdown(rows: list[dict], columns: dict[str, str], links=None) -> str:
    """A Markdown table of ``rows`` with ``columns`` (key -> header); ``links`` turns a run id into a cell."""
    if not rows:
        return "_none_\n"
    cell = lambda key, value: links(value) if links and key.endswith("run") else fmt(value)  # noqa: E731
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(k, r.get(k)) for k in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Sections:
    """A workload's own parts of the report over its runs: Markdown blocks (each one line group of report.md) in
    two places, its figures, its rollouts' rows, and tables of its own that the report returns beside its tables."""

    training: list[str] = field(default_factory=list)  # after the device x batch size tables
    rollouts: list[str] = field(default_factory=list)  # after time to quality
    figures: list[Path] = field(default_factory=list)  # written into the report's folder, shown at its end
    rollout_rows: list[dict] = field(default_factory=list)  # one per finished rollout (the report's infer_rows)
    tables: dict[str, list[dict]] = field(default_factory=dict)  # name -> rows


def embed(markdown: str, folder: Path) -> str:
    """The Markdown with each local figure ![x](name.png) as a data URI, for viewers without the files."""
    import base64

    def inline(match) -> str:
        data = base64.b64encode((folder / match.group(2)).read_bytes()).decode()
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return re.sub(r"!\[([^\]]*)\]\(([^)/:]+\.png)\)", inline, markdown)


def write_html(markdown_path: Path, title: str) -> Path:
    """``report.html`` beside ``report.md``: the same text, tables and figures (inline, so that it
    reads alone, in a browser or in MLflow's artifact preview)."""
    import html

    import markdown

    body = markdown.markdown(embed(markdown_path.read_text(), markdown_path.parent), extensions=["tables"])
    style = "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px}"
    out = markdown_path.with_suffix(".html")
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                   f"<style>{style}</style></head><body>{body}</body></html>")
    return out
