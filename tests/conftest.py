"""Shared fixtures; guards that no test leaves a process behind and that only tests marked
e2e start what makes a test slow (ranks, sshd, network namespaces, Chromium, Prometheus)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
from collections.abc import Generator

import pluggy
import psutil
import pytest

from serving.blas import load_openblas
from testkit.model_fixtures import (  # noqa: F401
    bundled_model_dir,
    bundled_quantized_dir,
    tiny_model_dir,
)
from testkit.netns import netns_hosts  # noqa: F401
from testkit.sshd import sshd  # noqa: F401

E2E_PROGRAMS = {"sshd", "chromium", "chrome", "chrome_crashpad_handler", "prometheus", "ip"}
WATCH_INTERVAL_S = 0.25  # e2e programs live for seconds; a poll costs ~5 ms

# A suite started in the background (`scripts/test &`, a CI runner without a terminal)
# may inherit SIGINT ignored, and pass it on to every process a test starts: the Ctrl-C
# tests (`pull`, `up`, `down`) need it delivered. A Python handler here makes children
# start with the default again.
signal.signal(signal.SIGINT, signal.default_int_handler)


def _openblas_here() -> None:
    """Plain mlx-lm's references, computed in this process, run on OpenBLAS as the ranks
    do: MLX's own BLAS takes ~3x as long for float32 (20 greedy tokens of SmolLM2: 17 s,
    not 6). Only before MLX's first import, so here; the thread count it sets stays out of
    the environment of the ranks the tests start (each sets its own)."""
    preset = os.environ.get("OPENBLAS_NUM_THREADS")
    load_openblas()
    if preset is None:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


_openblas_here()


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


class _E2eWatch:
    """Polls this process's descendants in a thread, noting the new e2e ones."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.before = {child.pid for child in self.me.children(recursive=True)}
        self.seen: dict[int, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="e2e-guard", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.wait(WATCH_INTERVAL_S):
            with contextlib.suppress(psutil.Error):
                for child in self.me.children(recursive=True):
                    if child.pid in self.before or child.pid in self.seen:
                        continue
                    if (what := _e2e_program(child)) is not None:
                        self.seen[child.pid] = what

    def finish(self) -> dict[int, str]:
        self.stop.set()
        self.thread.join()
        return self.seen


_WATCH = pytest.StashKey[_E2eWatch]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test not marked e2e must start no e2e program, in its fixtures (of any scope) or
    itself: `pytest -m "not e2e"` is the fast lane, and a test that slips into it unmarked
    fails, naming what it started. (Processes alive before its set-up are not its own: a
    session's sshd started by an earlier e2e test, say.)"""
    if item.get_closest_marker("e2e") is None:
        item.stash[_WATCH] = _E2eWatch()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    watch = item.stash.get(_WATCH, None)
    if call.when != "teardown" or watch is None:
        return
    started = watch.finish()
    report = outcome.get_result()
    if started and report.passed:
        what = "; ".join(f"pid {pid}: {line}" for pid, line in started.items())
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started {what} but is not marked e2e: add "
            "`pytestmark = pytest.mark.e2e` to its module (or @pytest.mark.e2e to it)"
        )


def _e2e_program(process: psutil.Process) -> str | None:
    """What makes `process` an e2e one (a rank, sshd, ...), or None."""
    argv = _cmdline(process)
    if not argv or argv == ["?"]:
        return None
    program = os.path.basename(argv[0].split(":")[0].split(" ")[0])  # "sshd: root@notty"
    line = " ".join(" ".join(argv).split())[:120]  # a `python -c` script on one line
    if program in E2E_PROGRAMS and (program != "ip" or "netns" in argv):
        return line
    if any(a == "-m" and b.startswith("serving") for a, b in itertools.pairwise(argv)):
        return f"a rank: {line}"
    with contextlib.suppress(psutil.Error):
        if "MLX_RANK" in process.environ():
            return f"an MLX rank: {line}"
    return None


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return ["?"]
