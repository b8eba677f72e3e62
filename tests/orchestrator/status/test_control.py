"""`down --keep-ranks` refusals and `status` with an orphaned gang (orchestrator/status/
control.py), against a recorded state whose orchestrator is a real process (a `sleep`)
or one that has exited: the exit codes docs/operations.md gives."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator.config import load_cluster
from orchestrator.state_file import ClusterState, state_path, write_state
from orchestrator.status import control
from testkit.orchestrator_process import write_cluster

NODES = [{"name": "a", "ip": "127.0.0.1"}]


@pytest.fixture
def stand_in() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for a running orchestrator (its PID and start time recorded)."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _record(tmp_path: Path, pid: int, **supervisor: float) -> Path:
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", NODES,
                           supervisor=supervisor)
    spec = load_cluster(config)
    started = psutil.Process(pid).create_time() if psutil.pid_exists(pid) else 0.0
    write_state(state_path(spec), ClusterState(
        cluster=spec.cluster.name, config=str(config), orchestrator_pid=pid,
        orchestrator_started=started, api_url="http://127.0.0.1:9"))
    return config


def test_keep_ranks_is_refused_with_orphan_grace_0_and_nothing_is_signalled(
    tmp_path: Path, stand_in: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """orphan_grace_s = 0: the agents would end the ranks with the orchestrator, so
    `down --keep-ranks` is refused (exit 2, says why and the fix); the orchestrator runs on."""
    config = _record(tmp_path, stand_in.pid, orphan_grace_s=0.0)
    assert control.down(config, keep_ranks=True) == control.EXIT_DOWN == 2
    assert "orphan_grace_s is 0" in capsys.readouterr().err
    assert stand_in.poll() is None


def test_keep_ranks_is_refused_without_an_orchestrator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recorded orchestrator has exited: nothing to keep the ranks from (exit 2);
    a plain `down` with no state at all is 0, not running."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    config = _record(tmp_path, gone.pid, orphan_grace_s=60.0)
    assert control.down(config, keep_ranks=True) == 2
    assert "no orchestrator is running" in capsys.readouterr().err
    state_path(load_cluster(config)).unlink()
    assert control.down(config) == 0
    assert "not running" in capsys.readouterr().out


def test_keep_ranks_asks_a_running_orchestrator_to_exit_leaving_the_ranks(
    tmp_path: Path, stand_in: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """Allowed: SIGUSR1 (which `up` takes as "exit, ranks serve on"), exit 0 once it is
    gone. The stand-in dies of the signal, as the default action is."""
    config = _record(tmp_path, stand_in.pid, orphan_grace_s=60.0)
    assert control.down(config, keep_ranks=True, timeout_s=10) == 0
    assert stand_in.wait(5) == -10  # SIGUSR1
    assert "the ranks serve on for up to 60 s" in capsys.readouterr().out


def test_status_of_an_orphaned_gang_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state file whose orchestrator is gone: `status` tells of the agents' gang (here:
    none reached) and exits 2, not running, with or without --json."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    config = _record(tmp_path, gone.pid)
    assert control.status(config, as_json=False) == 2
    assert "no orchestrator" in capsys.readouterr().out
    assert control.status(config, as_json=True) == 2
