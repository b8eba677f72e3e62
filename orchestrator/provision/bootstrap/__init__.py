"""`orchestrator bootstrap`: each node's venv with this machine's versions, installed offline."""
