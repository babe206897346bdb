"""What the report and the run artifacts share to show results: Markdown tables, figures, the report's cells, sections and page."""
