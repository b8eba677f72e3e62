"""Fixtures of the orchestrator's tests."""

from tests.orchestrator.supervisor_harness import harness  # noqa: F401
