"""The bench-… commands, one module each: standalone measurements that import no Prefect or MLflow, so they run on a bare compute host."""
