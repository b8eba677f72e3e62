"""`orchestrator init local`: this machine probed for real (no SSH), the file validates."""

from __future__ import annotations

import tomllib
from pathlib import Path

from testkit.orchestrator_process import run_cli


def test_init_local_writes_a_one_node_file_that_validates(tmp_path: Path) -> None:
    """One local node with its memory; -o refuses to overwrite without --force."""
    out = tmp_path / "cluster.toml"
    done = run_cli("init", "local", "-o", str(out), "--name", "here")
    assert done.returncode == 0, done.stderr
    data = tomllib.loads(out.read_text())
    ((node,),) = [data["nodes"]]
    assert node["transport"] == "local" and node["memory_gb"] > 0
    assert data["cluster"] == {"name": "here", "backend": "ring"}
    assert run_cli("validate", str(out)).returncode == 0
    again = run_cli("init", "local", "-o", str(out))
    assert again.returncode == 2 and "--force" in again.stderr


def test_init_of_an_unreachable_host_names_it(tmp_path: Path) -> None:
    """A host that refuses SSH: exit 1 naming it, nothing written."""
    out = tmp_path / "cluster.toml"
    done = run_cli("init", "local", "nobody@127.0.0.1", "-o", str(out))
    assert done.returncode == 1 and "nobody@127.0.0.1" in done.stderr
    assert not out.exists()
