"""Stage report: tables, figures and the Markdown/HTML report over one benchmark's runs (task.py, flow process)."""
