"""`orchestrator bootstrap` against namespace hosts with their own sshd and no package
index: wheels pushed over SFTP, a venv installed offline, a rank served from it."""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from orchestrator.provision.bootstrap.platforms import local_platform
from testkit.netns import TC, HostsFactory, MultiHost, sh
from testkit.orchestrator_process import ROOT, gateway_status, run_cli, running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
NO_STANDBY = {"standby_ranks": False, "stop_grace_s": 3.0}


def bootstrap_node(net: MultiHost, venv: Path, **overrides: Any) -> dict[str, Any]:
    node = net.node(0, **overrides)
    del node["python"]  # the venv's python is the node's python
    node["venv"] = str(venv)
    return node


def start_bootstrap(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "bootstrap", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )


@contextlib.contextmanager
def slow_link(net: MultiHost, rate: str = "80mbit") -> Iterator[None]:
    """The management cable towards host 0 at `rate`, so a push takes seconds."""
    dev = f"{net.prefix}m0"
    sh(
        TC,
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        "64kb",
        "latency",
        "400ms",
    )
    try:
        yield
    finally:
        sh(TC, "qdisc", "del", "dev", dev, "root", check=False)


def drop_ssh_sessions(net: MultiHost) -> int:
    """Kill, by PID, every session process of host 0's sshd: its connections drop."""
    assert net.hosts[0].sshd is not None
    sessions = psutil.Process(net.hosts[0].sshd.pid).children()
    for session in sessions:
        with contextlib.suppress(psutil.NoSuchProcess):
            session.kill()
    return len(sessions)


def wait_for_file(directory: Path, pattern: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not list(directory.glob(pattern)):
        assert process.poll() is None, f"bootstrap ended first:\n{process.communicate()[0]}"
        assert time.monotonic() < deadline, "no wheel arrived on the node"
        time.sleep(0.05)


def venv_versions(net: MultiHost, venv: Path) -> list[str]:
    """Versions seen by the venv's python inside the host (which has no package index)."""
    code = "import importlib.metadata as m, mlx.core; " + (
        "print(m.version('mlx'), m.version('mlx-cpu'), m.version('mlx-lm'), m.version('msgspec'))"
    )
    result = net.hosts[0].run([str(venv / "bin" / "python"), "-c", code], timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_bootstrap_resumes_after_a_drop_and_a_rank_runs_from_the_venv(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A connection cut while wheels are pushed fails naming the node; the next run resumes
    and makes a venv with our versions; `up` runs the rank from it; a third run leaves it."""
    net = netns_hosts(1, "switch")
    venv, wheels = tmp_path / "venv", tmp_path / "node-wheels"
    node = bootstrap_node(net, venv)
    config = write_cluster(
        tmp_path,
        str(tiny_model_dir),
        [node],
        model={"id": "tiny"},
        bootstrap={"wheel_dir": str(wheels)},
        supervisor=NO_STANDBY,
    )
    with slow_link(net):
        process = start_bootstrap(config)
        wait_for_file(wheels / local_platform().key, "*.whl", process)
        assert drop_ssh_sessions(net) >= 1
        out, _ = process.communicate(timeout=120)
    assert process.returncode == 1, out
    assert "[h0] FAILED: lost the node while pushing wheels" in out, out
    assert "run `orchestrator bootstrap` again: it resumes" in out and "Traceback" not in out

    plan = run_cli("bootstrap", str(config), "--dry-run", timeout=300)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert re.search(r"\[h0\] would create: all \d+ wheels cached", plan.stdout), plan.stdout
    assert not venv.exists()

    started = time.monotonic()
    second = run_cli("bootstrap", str(config), timeout=600)
    print(f"second (resumed) bootstrap: {time.monotonic() - started:.1f} s\n{second.stdout}")
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = re.search(r"pushed (\d+) wheels .* \((\d+) already there\)", second.stdout)
    assert resumed and int(resumed.group(2)) >= 1, second.stdout
    assert not list(wheels.rglob("*.part-*"))  # what the cut left half-sent is gone
    assert re.search(r"h0\s+create\s+python = " + re.escape(f"{venv}/bin/python"), second.stdout)
    ours = [metadata.version(n) for n in ("mlx", "mlx-cpu", "mlx-lm", "msgspec")]
    assert venv_versions(net, venv) == ours

    serve_from_venv(config, venv)

    started = time.monotonic()
    third = run_cli("bootstrap", str(config), timeout=120)
    elapsed = time.monotonic() - started
    print(f"third bootstrap: {elapsed:.1f} s\n{third.stdout}")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "already matches: left alone" in third.stdout
    assert "0 wheels downloaded" in third.stdout and elapsed < 20


def serve_from_venv(config: Path, venv: Path) -> None:
    """A 1-rank cluster on the node: its rank process is the venv's python and answers."""
    url = f"http://127.0.0.1:{tomllib.loads(config.read_text())['api']['port']}"
    with running(config, url=url) as orchestrator:
        (rank,) = gateway_status(url)["ranks"]  # as `status --json`, without a CLI's start
        assert psutil.Process(rank["pid"]).cmdline()[0] == f"{venv}/bin/python"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=120)
        reply = client.completions.create(model="tiny", prompt="Hello", max_tokens=4)
        assert reply.choices[0].text is not None
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True)
    sh("/usr/bin/mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path))
    try:
        yield path
    finally:
        sh("/usr/bin/umount", "-l", str(path), check=False)


def other_minor_python() -> str | None:
    for path in sorted(Path("/root/.pyenv/versions").glob("3.*/bin/python3")):
        if not path.parent.parent.name.startswith(f"3.{sys.version_info.minor}."):
            return str(path)
    return None


def test_bad_nodes_get_errors_naming_them_and_the_fix(
    netns_hosts: HostsFactory, tmp_path: Path
) -> None:
    """No python of our minor, too little space, a read-only venv path, a directory that
    is not our venv, sshd not listening: each node fails alone, named, with its fix."""
    with (
        mounted_tmpfs(tmp_path / "small", "size=24m") as small,
        mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as read_only,
    ):
        net = netns_hosts(1, "switch")  # made after the mounts, so its sshd sees them
        (tmp_path / "theirs").mkdir()
        (tmp_path / "theirs" / "notes.txt").write_text("mine")
        nodes = [
            dict(bootstrap_node(net, small / "venv"), name="small"),
            dict(bootstrap_node(net, read_only / "venv"), name="readonly"),
            dict(bootstrap_node(net, tmp_path / "theirs"), name="theirs"),
            dict(bootstrap_node(net, tmp_path / "v", ssh_port=2), name="down"),
        ]
        wheels = {"wheel_dir": str(tmp_path / "w")}
        config = write_cluster(tmp_path, "/models/none", nodes, bootstrap=wheels)
        result = run_cli("bootstrap", str(config), timeout=300)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "Traceback" not in out + result.stderr
    assert re.search(
        r"\[small\] FAILED: the venv needs about \d+ MiB under "
        + re.escape(str(small))
        + r", which has 2\d MiB free",
        out,
    ), out
    assert f"[readonly] FAILED: cannot write the venv {read_only}/venv: Read-only file " in out
    assert "fix: choose a venv on a writable disk" in out
    assert f"[theirs] FAILED: {tmp_path}/theirs exists and was not made by orchestrator" in out
    assert "[down] FAILED:" in out and "refused the connection" in out
    assert out.count("fix:") >= 3

    other = other_minor_python()
    tried = [other] if other else []
    node = dict(bootstrap_node(net, tmp_path / "v2"), name="oldpy")
    config = write_cluster(
        tmp_path, "/models/none", [node], bootstrap={**wheels, "base_python": [*tried, "nope3"]}
    )
    result = run_cli("bootstrap", str(config), timeout=120)
    assert result.returncode == 1
    assert f"[oldpy] FAILED: no CPython 3.{sys.version_info.minor} found" in result.stdout
    assert "nope3: not found" in result.stdout and "fix: install Python" in result.stdout
    if other:
        assert f"{other}: cpython 3." in result.stdout
