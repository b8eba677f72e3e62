"""`orchestrator init`: probe hosts, find their cables, write a cluster.toml (command.py)."""
