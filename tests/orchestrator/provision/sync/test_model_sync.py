"""`orchestrator sync` across network-namespace hosts, each with a private tmpfs at the
model's directory: the hosts really hold different files there."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import openai
import pytest

from node_agent.models.hashes import build_manifest
from node_agent.models.store import SYNC_MARKER
from orchestrator.config import ConfigErrors, check_cluster_file
from orchestrator.provision.sync.transfer import RESUME_WINDOW
from testkit.netns import HostsFactory, MultiHost, PrivateTmpfs
from testkit.orchestrator_process import ROOT, run_cli, running, write_cluster
from testkit.sync_runs import (
    NO_STANDBY,
    WIRE_FRAMING,
    by_node,
    flip_a_byte,
    place_model,
    same_files,
    same_model,
    sync,
    wire_bytes,
)

pytestmark = pytest.mark.timeout(300)

WEIGHTS = "model.safetensors"


def config_for(tmp_path: Path, net: MultiHost, model: Path, **model_keys: Any) -> Path:
    nodes = [net.node(i) for i in range(len(net.hosts))]
    return write_cluster(tmp_path, str(model), nodes, model=model_keys, **NO_STANDBY)


def test_sync_settings_are_checked_with_the_config(tmp_path: Path) -> None:
    """model.sync with a bundled model, and a model.sync_from naming no node, are config
    errors naming their fields; `sync` of a bundled model says it is not synced."""
    config = tmp_path / "cluster.toml"
    config.write_text(
        '[model]\npath = "bundled:smollm2-135m-instruct"\nsync = true\nsync_from = "x"\n'
        '[[nodes]]\nname = "a"\n'
    )
    with pytest.raises(ConfigErrors) as caught:
        check_cluster_file(config)
    assert {issue.path for issue in caught.value.issues} == {"model.sync", "model.sync_from"}
    config.write_text('[model]\npath = "bundled:smollm2-135m-instruct"\n[[nodes]]\nname = "a"\n')
    done = run_cli("sync", str(config))
    assert done.returncode == 2 and "bundled model: it is not synced" in done.stderr


@pytest.mark.e2e
def test_a_node_without_the_model_gets_it_and_the_cluster_serves(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`up` with model.sync copies the model to two empty hosts, then serves from it."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    net = netns_hosts(2, "switch", PrivateTmpfs(str(mount), "128m"))
    assert not net.hosts[0].path(model).exists()
    config = config_for(tmp_path, net, model, sync=True)
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, url=url) as orchestrator:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=120)
        reply = client.completions.create(model="tiny", prompt="Hi", max_tokens=4, temperature=0)
        assert reply.choices[0].text
        assert any("synced" in line for line in orchestrator.output), orchestrator.text
    assert same_model(net, 0, model, tiny_model_dir) and same_model(net, 1, model, tiny_model_dir)


@pytest.mark.e2e
def test_one_corrupted_byte_is_found_by_the_full_digest_and_repaired(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A byte flipped in a weight file (size and mtime kept) is found; only that file is
    sent again (counted on the wire); a third sync has nothing to do, sends no file and
    rehashes nothing; `--from h0` repairs it, and this machine's own copy, from a node's
    copy. Copies are compared byte for byte with the original."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    net = netns_hosts(2, "switch", PrivateTmpfs(str(mount), "128m"))
    config = config_for(tmp_path, net, model)
    code, first = sync(config)
    assert code == 0 and [n["status"] for n in first["nodes"]] == ["synced", "synced"], first
    assert same_model(net, 0, model, tiny_model_dir) and same_model(net, 1, model, tiny_model_dir)
    weights = net.hosts[1].path(model / WEIGHTS)
    st = flip_a_byte(weights)
    assert not same_model(net, 1, model, tiny_model_dir)
    before = wire_bytes(net)
    code, second = sync(config)
    h0_in, h1_in = (after - b for after, b in zip(wire_bytes(net), before, strict=True))
    nodes = by_node(second)
    assert code == 0 and nodes["h0"]["status"] == "current", second
    assert nodes["h1"]["status"] == "synced" and nodes["h1"]["sent_bytes"] == st.st_size
    assert nodes["h1"]["reused_bytes"] == second["total_bytes"] - st.st_size
    assert second["hashed_bytes"] == 0  # the source's hashes all came from its cache
    # Both hosts had the same talk (connect, agent, manifests); h1 got the file on top:
    # its bytes plus SSH and TCP framing (a few %), not the rest of the model.
    assert st.st_size <= h1_in - h0_in <= st.st_size * WIRE_FRAMING, (h0_in, h1_in, st.st_size)
    assert same_model(net, 1, model, tiny_model_dir)
    before = wire_bytes(net)
    code, third = sync(config)
    talk = [after - b for after, b in zip(wire_bytes(net), before, strict=True)]
    assert code == 0 and {n["status"] for n in third["nodes"]} == {"current"}
    assert [n["hashed_bytes"] for n in third["nodes"]] == [0, 0]  # the nodes' caches too
    assert max(talk) < st.st_size / 10, talk  # no file went over the wire
    # h1's copy and this machine's (a `local` node) are repaired from h0's, relayed here.
    reference = build_manifest(net.hosts[0].path(model))[0]
    flip_a_byte(weights)
    flip_a_byte(model / WEIGHTS)
    # This machine's copy was placed by hand: sync replaces only its own copies, so the
    # operator who wants it repaired lets sync own it (a foreign one is refused: test_store).
    (model / SYNC_MARKER).write_text("")
    here = {"name": "here", "transport": "local", "ip": "127.0.0.1", "python": sys.executable}
    (tmp_path / "wl").mkdir()  # short: an agent socket path under it is bounded (103 bytes)
    nodes_table = [here, net.node(0), net.node(1)]
    with_local = write_cluster(tmp_path / "wl", str(model), nodes_table, **NO_STANDBY)
    code, fourth = sync(with_local, "--from", "h0")
    nodes = by_node(fourth)
    assert code == 0 and nodes["h0"]["status"] == "source", fourth
    for name in ("h1", "here"):
        assert nodes[name]["status"] == "synced" and nodes[name]["sent_bytes"] == st.st_size
    assert build_manifest(net.hosts[1].path(model))[0] == reference == build_manifest(model)[0]
    assert same_model(net, 1, model, tiny_model_dir) and same_files(model, tiny_model_dir)


@pytest.mark.e2e
def test_an_interrupted_sync_resumes_and_sends_less(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """SIGKILL the orchestrator mid-copy (slow link): nothing at the real path; the next
    sync resumes from the verified staged bytes and ends verified."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    net = netns_hosts(1, "switch", PrivateTmpfs(str(mount), "128m"))
    config = config_for(tmp_path, net, model)
    total = (model / WEIGHTS).stat().st_size
    staged = net.hosts[0].path(Path(f"{model}.partial-sync") / WEIGHTS)
    net.shape_mgmt(0, "40mbit")
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "sync", str(config), "--json"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (staged.exists() and staged.stat().st_size > total * 0.8):
            assert time.monotonic() < deadline and process.poll() is None, "no progress"
            time.sleep(0.05)
        at_kill = staged.stat().st_size
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    assert not net.hosts[0].path(model).exists()
    net.shape_mgmt(0, None)
    before = net.mgmt_bytes_in(0)
    code, report = sync(config)
    resumed_in = net.mgmt_bytes_in(0) - before
    node = by_node(report)["h0"]
    assert code == 0 and node["status"] == "synced", report
    # Resumed before the last RESUME_WINDOW bytes (writes in flight may have left holes).
    kept = at_kill - RESUME_WINDOW
    assert node["resumed_bytes"] >= kept > 0
    assert node["sent_bytes"] <= report["total_bytes"] - kept
    assert same_model(net, 0, model, tiny_model_dir)
    # On the wire: what was not kept, framed, plus the talk of a sync with nothing to send.
    before = net.mgmt_bytes_in(0)
    code, _ = sync(config)
    talk = net.mgmt_bytes_in(0) - before
    assert code == 0
    sent_at_most = (report["total_bytes"] - kept) * WIRE_FRAMING + talk
    assert resumed_in <= sent_at_most, (resumed_in, sent_at_most, report["total_bytes"])


@pytest.mark.e2e
def test_a_small_disk_and_a_read_only_one_are_refused_and_a_bad_source_named(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """h1's 8 MB disk: refused before any copy with the space needed and free; h2's
    read-only file system: refused naming the path and the fix; h0 is synced all the
    same. A missing source, and a source file that cannot be read (a dangling symlink),
    stop the sync before it connects, naming them."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    sizes = [PrivateTmpfs(str(mount), size) for size in ("128m", "8m", "128m")]
    net = netns_hosts(3, "switch", sizes)
    read_only = net.hosts[2]
    assert read_only.sshd is not None
    remount = ["nsenter", "-t", str(read_only.sshd.pid), "-m", "mount", "-o", "remount,ro"]
    subprocess.run([*remount, str(mount)], check=True, timeout=30)
    config = config_for(tmp_path, net, model)
    code, report = sync(config)
    nodes = by_node(report)
    assert code == 1 and nodes["h0"]["status"] == "synced", report
    error = nodes["h1"]["error"]
    assert nodes["h1"]["status"] == "failed" and "needs" in error and "free" in error, error
    assert list(net.hosts[1].path(mount).iterdir()) == []
    error = nodes["h2"]["error"]
    assert f"{model}.partial-sync" in error and "Read-only" in error, error
    assert "permissions" in error
    text = run_cli("sync", str(config))
    failed = [line for line in text.stdout.splitlines() if "FAILED" in line]
    assert text.returncode == 1 and [line.split()[0] for line in failed] == ["h1", "h2"]
    (tmp_path / "other").mkdir()
    missing = config_for(tmp_path / "other", net, mount / "nope")
    done = run_cli("sync", str(missing))
    assert done.returncode == 2 and f"{mount / 'nope'} does not exist" in done.stderr
    (model / "extra.safetensors").symlink_to(tmp_path / "gone")
    dangling = run_cli("sync", str(config))
    assert dangling.returncode == 2 and "extra.safetensors" in dangling.stderr
    assert "Traceback" not in done.stderr + text.stderr + dangling.stderr


def slow_sync(net: MultiHost, config: Path) -> subprocess.Popen[str]:
    net.shape_mgmt(0, "40mbit")
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "sync", str(config), "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_staged(process: subprocess.Popen[str], staged: Path, size: int) -> None:
    deadline = time.monotonic() + 60
    while not (staged.exists() and staged.stat().st_size > size):
        assert time.monotonic() < deadline and process.poll() is None, "no progress"
        time.sleep(0.05)


@pytest.mark.e2e
def test_a_disk_full_midway_names_node_and_file_and_the_next_run_recovers(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The disk fills up during the copy: the error names the node, the file and a full
    disk; nothing at the real path; with room again, the next sync resumes and verifies."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    net = netns_hosts(1, "switch", PrivateTmpfs(str(mount), "40m"))
    config = config_for(tmp_path, net, model)
    staged = net.hosts[0].path(Path(f"{model}.partial-sync") / WEIGHTS)
    process = slow_sync(net, config)
    try:
        wait_staged(process, staged, 4 << 20)
        filler = net.hosts[0].path(mount / "filler")
        with filler.open("wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(bytes(1 << 20))
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    error = by_node(json.loads(out))["h0"]["error"]
    assert process.returncode == 1 and "Traceback" not in err
    assert f"{model}.partial-sync/{WEIGHTS}" in error and "disk is full" in error, error
    assert not net.hosts[0].path(model).exists()
    filler.unlink()
    net.shape_mgmt(0, None)
    code, report = sync(config)
    assert code == 0 and by_node(report)["h0"]["resumed_bytes"] > 0, report
    assert same_model(net, 0, model, tiny_model_dir)


@pytest.mark.e2e
def test_a_node_dropping_midway_is_named_and_the_next_run_recovers(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The node's SSH session dies mid-copy: a clear error naming node and file, no
    traceback, nothing at the real path; the next sync resumes and verifies."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    net = netns_hosts(1, "switch", PrivateTmpfs(str(mount), "128m"))
    config = config_for(tmp_path, net, model)
    staged = net.hosts[0].path(Path(f"{model}.partial-sync") / WEIGHTS)
    host = net.hosts[0]
    process = slow_sync(net, config)
    try:
        wait_staged(process, staged, 10 << 20)
        for pid in set(host.pids()) - {host.sshd.pid if host.sshd else 0}:
            os.kill(pid, signal.SIGKILL)  # the session's sshd, the agent, sftp-server
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    node = by_node(json.loads(out))["h0"]
    assert process.returncode == 1 and node["status"] == "failed", out + err
    assert "Traceback" not in err and node["error"], err
    assert not host.path(model).exists()
    net.shape_mgmt(0, None)
    code, report = sync(config)
    assert code == 0 and by_node(report)["h0"]["resumed_bytes"] > 0, report
    assert same_model(net, 0, model, tiny_model_dir)
