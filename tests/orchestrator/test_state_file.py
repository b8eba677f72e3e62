"""The state file is written through a fresh temporary file, never through a link."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.state_file import ClusterState, read_state, write_state


def test_a_link_at_the_temp_name_is_not_followed(tmp_path: Path) -> None:
    """A symlink planted at the temporary name leaves its target untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "state" / "c.toml"
    path.parent.mkdir()
    (path.with_suffix(f".tmp{os.getpid()}")).symlink_to(victim)
    state = ClusterState(cluster="c", config="/c.toml", orchestrator_pid=1,
                         orchestrator_started=0.0, api_url="http://127.0.0.1:1")
    write_state(path, state)
    assert victim.read_text() == "precious"
    assert read_state(path) == state and not path.is_symlink()
