"""Defaults a person cannot miss: no open API by accident, no silent Python 3.9 on a Mac."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from orchestrator.config import check_cluster_file
from orchestrator.config.api_auth import unset_key_issue
from orchestrator.config.summary import summarize

KEY = "SAFE_DEFAULTS_TEST_KEY"
OPEN_API = f"""
[api]
host = "0.0.0.0"
port = 8777
api_key_env = "{KEY}"
[[nodes]]
name = "a"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(text))
    return path


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "orchestrator.cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, env=env
    )


def test_up_refuses_an_open_api_whose_key_variable_is_unset(tmp_path: Path) -> None:
    """0.0.0.0 with api_key_env naming an unset variable: `up` exits 2 before connecting
    anything, naming the field, the variable and the three ways out."""
    path = write(tmp_path, OPEN_API)
    env = {k: v for k, v in os.environ.items() if k != KEY}
    result = run_cli("up", str(path), env=env)
    assert result.returncode == 2, result.stderr
    assert f"{path}: api.api_key_env: ${KEY} is not set in this shell" in result.stderr
    assert "allow_no_key = true" in result.stderr and f"export {KEY}=" in result.stderr
    assert "preflight" not in result.stderr  # refused before any node was reached


def test_validate_says_up_would_refuse_not_key_from(tmp_path: Path) -> None:
    """validate in a shell without the variable says `up` refuses, not "key from $X"."""
    spec, warnings = check_cluster_file(write(tmp_path, OPEN_API))
    text = summarize(spec, warnings, Path("cluster.toml"), environ={})
    assert f"(${KEY} is unset here: `up` refuses)" in text
    assert "key from" not in text and "allow_no_key = true" in text
    with_key = summarize(spec, warnings, Path("cluster.toml"), environ={KEY: "s3cret"})
    assert f"(key from ${KEY})" in with_key and "refuses" not in with_key


def test_open_api_without_key_only_when_chosen_or_on_loopback(tmp_path: Path) -> None:
    """allow_no_key = true, or a loopback host, serves without a key; validate says so."""
    chosen, _ = check_cluster_file(
        write(tmp_path, OPEN_API.replace('[api]\n', '[api]\nallow_no_key = true\n'))
    )
    assert unset_key_issue(chosen, {}) is None
    assert f"no API key: ${KEY} is unset here" in summarize(chosen, [], Path("c"), environ={})
    for host in ("127.0.0.1", "::1", "localhost"):
        local, _ = check_cluster_file(write(tmp_path, OPEN_API.replace("0.0.0.0", host)))
        assert unset_key_issue(local, {}) is None
    named, _ = check_cluster_file(write(tmp_path, OPEN_API.replace("0.0.0.0", "studio-a.local")))
    assert unset_key_issue(named, {}) is not None


def test_agent_on_a_stock_macs_python_names_version_and_bootstrap() -> None:
    """The agent under the Command Line Tools' Python 3.9 (simulated: this interpreter with
    its version and prefix replaced) exits 4 naming the Python, its version and the fix."""
    simulate = (
        "import sys, runpy\n"
        "sys.version_info = (3, 9, 6, 'final', 0)\n"
        "sys.prefix = '/Library/Developer/CommandLineTools/Library/Frameworks/"
        "Python3.framework/Versions/3.9'\n"
        "runpy.run_module('node_agent', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", simulate], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 4
    assert "is Python 3.9.6 (the Command Line Tools' Python)" in done.stderr
    assert "orchestrator bootstrap cluster.toml" in done.stderr


def test_bootstrap_with_a_venv_but_only_own_pythons_names_the_cause(tmp_path: Path) -> None:
    """[bootstrap] venv set while every ssh node names its python: bootstrap says which
    nodes set python (the venv only applies to ssh nodes without one), not "no venv"."""
    text = """
    [bootstrap]
    venv = "~/.venvs/mlx-cluster"
    [[nodes]]
    name = "a"
    ip = "10.0.0.1"
    [[nodes]]
    name = "b"
    transport = "ssh"
    ssh = "me@b"
    ip = "10.0.0.2"
    python = "/opt/py/bin/python"
    """
    result = run_cli("bootstrap", str(write(tmp_path, text)), env=dict(os.environ))
    assert result.returncode == 2
    assert "applies only to ssh nodes that set no python (b sets python; a is local)" in (
        result.stderr
    )
    assert "remove python from those [[nodes]] tables" in result.stderr


def test_up_refuses_a_lan_api_without_api_key_env(tmp_path: Path) -> None:
    """No api_key_env at all, on 0.0.0.0 or a LAN address: `up` exits 2 naming the field
    and the fixes; validate warns; allow_no_key = true lets it serve on purpose."""
    isolated = (  # were `up` to go on, it would fail at once, touching nothing shared
        f'[cluster]\nstate_dir = "{tmp_path / "state"}"\n[model]\npath = "{tmp_path / "none"}"\n'
    )
    for host in ("0.0.0.0", "192.168.1.20"):
        path = write(tmp_path, isolated + f'[api]\nhost = "{host}"\n[[nodes]]\nname = "a"\n')
        result = run_cli("up", str(path), env=dict(os.environ))
        assert result.returncode == 2, result.stderr
        assert f"{path}: api.api_key_env: is not set" in result.stderr
        assert "allow_no_key = true" in result.stderr and "preflight" not in result.stderr
        spec, warnings = check_cluster_file(path)
        assert [w.path for w in warnings] == ["api.host"] and "`up` refuses" in warnings[0].message
        assert "no api_key_env: `up` refuses" in summarize(spec, warnings, path, environ={})
    chosen, warnings = check_cluster_file(
        write(tmp_path, '[api]\nhost = "0.0.0.0"\nallow_no_key = true\n[[nodes]]\nname = "a"\n')
    )
    assert unset_key_issue(chosen, {}) is None and warnings == []
