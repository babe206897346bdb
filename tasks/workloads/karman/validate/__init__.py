"""Karman's validation: its solver against the Schäfer–Turek benchmark (task.py in the flow process, job.py in a child)."""
