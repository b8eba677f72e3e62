"""Secret files (the launch secret, the thinking key, a rank's files, a service's env file)
are written through a fresh O_EXCL|O_NOFOLLOW temporary file: never through a link left
at the target's or at a predictable temporary name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from contract.private_file import write_private
from node_agent.host_ops import write_files
from orchestrator.launch import launch_secret, thinking_key


def _plant(directory: Path, names: list[str], victim: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in names:
        (directory / name).symlink_to(victim)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    return victim


def test_write_private_replaces_a_link_and_keeps_its_mode(tmp_path: Path) -> None:
    """A link at the target is replaced (its target untouched); the mode is exact."""
    victim = _victim(tmp_path)
    _plant(tmp_path / "d", ["f"], victim)
    old = os.umask(0o077)
    try:
        write_private(tmp_path / "d" / "f", b"secret", 0o644)
    finally:
        os.umask(old)
    target = tmp_path / "d" / "f"
    assert not target.is_symlink() and target.read_bytes() == b"secret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f"]  # no temporary left


def test_launch_secret_and_thinking_key_never_write_through_links(tmp_path: Path) -> None:
    """Links planted at the files' names and at the old predictable temporary names
    (`.tmp<pid>`) leave their target untouched; the files are regular and 0600."""
    victim, state = _victim(tmp_path), tmp_path / "state"
    names = ["c.launch-secret.json", f"c.launch-secret.tmp{os.getpid()}",
             "c.thinking-key", f"c.tmp{os.getpid()}"]
    _plant(state, names, victim)
    launch_secret.save(state, "c", launch_secret.LaunchSecret(launch_id="L", secret="s3cret"))
    key = thinking_key.ensure(state, "c")
    assert victim.read_text() == "precious"
    for path in (launch_secret.secret_path(state, "c"), thinking_key.key_path(state, "c")):
        assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert thinking_key.key_path(state, "c").read_text() == key != "precious"


def test_a_ranks_files_never_write_through_links(tmp_path: Path) -> None:
    """A link at a rank file's name (e.g. launch_secret) is replaced, not followed."""
    victim = _victim(tmp_path)
    _plant(tmp_path / "rank", ["launch_secret"], victim)
    write_files(tmp_path / "rank", {"launch_secret": "s3cret"})
    assert victim.read_text() == "precious"
    assert (tmp_path / "rank" / "launch_secret").read_text() == "s3cret"
