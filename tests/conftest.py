"""Shared fixtures, and a guard that no test run leaves a process behind."""

from __future__ import annotations

import contextlib

import psutil
import pytest

from testkit.netns import netns_hosts  # noqa: F401
from testkit.sshd import sshd  # noqa: F401
from tests.model_fixtures import (  # noqa: F401
    bundled_model_dir,
    bundled_quantized_dir,
    tiny_model_dir,
)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any child process outlived its fixtures; end them by PID."""
    leftovers = psutil.Process().children(recursive=True)
    if not leftovers:
        return
    names = ", ".join(f"{child.pid} {' '.join(_cmdline(child))[:120]}" for child in leftovers)
    for child in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    print(f"\nERROR: processes left behind by the tests (now killed): {names}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return ["?"]
