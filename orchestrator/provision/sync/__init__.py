"""`orchestrator sync`: the model directory from one source to every node, content-verified."""
