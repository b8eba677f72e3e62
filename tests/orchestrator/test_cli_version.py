"""`orchestrator --version`: ours and the versions of mlx, mlx-lm and Python, as installed."""

from __future__ import annotations

import importlib.metadata as metadata
import platform
import subprocess
import sys


def test_version_names_ours_mlx_mlx_lm_and_python() -> None:
    """One line with the versions installed here, read from the packages' metadata."""
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    expected = (
        f"mlx-cluster-orchestrator {metadata.version('mlx-cluster-orchestrator')} "
        f"(mlx {metadata.version('mlx')}, mlx-lm {metadata.version('mlx-lm')}, "
        f"Python {platform.python_version()})"
    )
    assert result.stdout.strip() == expected
