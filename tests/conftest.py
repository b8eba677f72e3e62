"""Shared fixtures; guards that no test leaves a process behind and that only tests marked
e2e start what makes a test slow (ranks, sshd, network namespaces, Chromium, Prometheus)."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator

import psutil
import pytest

from testkit.netns import netns_hosts  # noqa: F401
from testkit.sshd import sshd  # noqa: F401
from tests.model_fixtures import (  # noqa: F401
    bundled_model_dir,
    bundled_quantized_dir,
    tiny_model_dir,
)

E2E_PROGRAMS = {"sshd", "chromium", "chrome", "chrome_crashpad_handler", "prometheus", "ip"}
WATCH_INTERVAL_S = 0.05


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


@pytest.fixture(autouse=True)
def _e2e_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test not marked e2e must start none of the e2e programs: `pytest -m "not e2e"` is
    the fast lane, and a test that slips into it unmarked fails here, naming what it started.
    Polls this process's descendants while the test runs (the ones alive before it are
    ignored: a session's sshd, say)."""
    if request.node.get_closest_marker("e2e"):
        yield
        return
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    seen: dict[int, str] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(WATCH_INTERVAL_S):
            with contextlib.suppress(psutil.Error):
                for child in me.children(recursive=True):
                    if child.pid in before or child.pid in seen:
                        continue
                    if (what := _e2e_program(child)) is not None:
                        seen[child.pid] = what

    watcher = threading.Thread(target=watch, name="e2e-guard", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
    if seen:
        started = "; ".join(f"pid {pid}: {what}" for pid, what in seen.items())
        pytest.fail(
            f"this test started {started} but is not marked e2e: add "
            "`pytestmark = pytest.mark.e2e` to its module (or @pytest.mark.e2e to it)",
            pytrace=False,
        )


def _e2e_program(process: psutil.Process) -> str | None:
    """What makes `process` an e2e one (a rank, sshd, ...), or None."""
    argv = _cmdline(process)
    if not argv or argv == ["?"]:
        return None
    program = os.path.basename(argv[0].split(":")[0].split(" ")[0])  # "sshd: root@notty"
    if program in E2E_PROGRAMS and (program != "ip" or "netns" in argv):
        return " ".join(argv)[:120]
    if any(a == "-m" and b.startswith("serving") for a, b in itertools.pairwise(argv)):
        return "a rank: " + " ".join(argv)[:120]
    with contextlib.suppress(psutil.Error):
        if "MLX_RANK" in process.environ():
            return "an MLX rank: " + " ".join(argv)[:120]
    return None


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return ["?"]
