"""Stage train: the Prefect task and its planning (task.py, flow process, no framework imported) and the training job (job.py, child process)."""
