"""`service status` and `service uninstall` from a shell without the API key's variable:
the installed service holds the key, so only `install` needs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.orchestrator_process import ROOT, write_cluster


def service(action: str, config: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SVC_KEY"} | {"HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "service", action, "--platform", "launchd",
         str(config)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False,
    )


@pytest.mark.parametrize("action", ["status", "uninstall"])
def test_status_and_uninstall_need_no_key(tmp_path: Path, action: str) -> None:
    """An API on 0.0.0.0 whose key variable is unset here: install refuses, naming it;
    status says "not installed" and uninstall "nothing to do", not a config error."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}],
                           api={"api_key_env": "SVC_KEY", "host": "0.0.0.0"})
    refused = service("install", config, tmp_path / "home")
    assert refused.returncode == 2 and "SVC_KEY" in refused.stderr + refused.stdout
    result = service(action, config, tmp_path / "home")
    assert "SVC_KEY" not in result.stderr, result.stderr
    assert "not installed" in result.stdout, result.stdout + result.stderr
