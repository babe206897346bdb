"""Stage infer: the Prefect task (task.py) and the rollout plan (plan.py) in the flow process, the rollout job (job.py) in the child process."""
