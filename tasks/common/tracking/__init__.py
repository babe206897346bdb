"""MLflow tracking and the names runs are found by: the one run context, tags and run names, the Prefect flow run a process works for, credentials, the Model Registry and the cells a rerun skips."""
