"""Rows of results as a Markdown table, for the reports and the run artifacts that show them."""


def markdown_table(rows: list[dict]) -> str:
    """A Markdown table of ``rows`` (dicts with the same keys, which head the columns); floats to four significant digits."""
    if not rows:
        return "_no finished runs_\n"
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"
