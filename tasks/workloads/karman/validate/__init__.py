"""Stage validate: the solver against the Schäfer–Turek benchmark (task.py, flow process)."""
