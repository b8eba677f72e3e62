"""cluster.toml texts written for a test, and the issues validation finds in one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.config import ConfigErrors, ConfigIssue, check_cluster_file


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(text))
    return path


def errors_of(tmp_path: Path, text: str) -> list[ConfigIssue]:
    with pytest.raises(ConfigErrors) as caught:
        check_cluster_file(write(tmp_path, text))
    return caught.value.issues
