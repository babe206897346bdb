"""Parts every stage shares, in the flow process and in the child jobs: settings, specs, the store, MLflow tracking, errors, child-process launch."""
