"""`orchestrator service`: run `orchestrator up cluster.toml` at boot (login on macOS),
restarted on failure, as a launchd agent (macOS) or a systemd unit (Linux)."""
