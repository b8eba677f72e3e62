"""Load on a running cluster, timed token by token: `orchestrator bench` and the benchmarks."""
