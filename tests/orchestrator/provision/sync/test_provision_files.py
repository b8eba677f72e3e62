"""What sync and bootstrap do with a node's files, on this machine's files (the same
NodeFiles calls the SFTP files answer; tests/orchestrator/transports/test_files.py holds
both to the same behaviour)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.provision.bootstrap.node_venv import push_files
from orchestrator.provision.sync.transfer import RESUME_WINDOW, LocalSource, copy_file
from orchestrator.transports.files import PART
from orchestrator.transports.local_files import LocalFiles


async def test_push_skips_files_of_the_same_size_and_removes_leftovers(tmp_path: Path) -> None:
    """Files already there at the same size stay; others are sent whole; a temporary a
    lost run left behind is removed; progress counts every file."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    paths = []
    for name, size in (("a.whl", 10), ("b.whl", 2000), ("c.whl", 5)):
        (here / name).write_bytes(os.urandom(size))
        paths.append(here / name)
    (there / "a.whl").write_bytes(b"x" * 10)  # same size: kept as it is
    (there / "b.whl").write_bytes(b"short")  # another size: replaced
    (there / f".c.whl{PART}dead").write_bytes(b"half")
    seen: list[tuple[int, int]] = []
    copied = await push_files(LocalFiles(), paths, str(there), lambda d, t: seen.append((d, t)))
    assert copied == 2 and sorted(seen) == [(1, 3), (2, 3), (3, 3)]
    assert (there / "a.whl").read_bytes() == b"x" * 10
    for name in ("b.whl", "c.whl"):
        assert (there / name).read_bytes() == (here / name).read_bytes()
    assert sorted(p.name for p in there.iterdir()) == ["a.whl", "b.whl", "c.whl"]


async def test_copy_file_sends_the_bytes_and_resumes_at_an_offset(tmp_path: Path) -> None:
    """copy_file sends a file larger than its window byte for byte; from an offset it
    keeps what is staged and sends only the rest."""
    source = tmp_path / "src"
    source.mkdir()
    size = RESUME_WINDOW * 2 + 12345
    data = os.urandom(size)
    (source / "w.bin").write_bytes(data)
    dest = tmp_path / "w.bin"
    files = LocalFiles()
    sent: list[int] = []
    reader = LocalSource(source)
    try:
        await copy_file(reader, files, "w.bin", str(dest), 0, size, sent.append)
        assert dest.read_bytes() == data and sum(sent) == size
        staged = RESUME_WINDOW + 7
        dest.write_bytes(data[:staged])
        sent.clear()
        await copy_file(reader, files, "w.bin", str(dest), staged, size, sent.append)
        assert dest.read_bytes() == data and sum(sent) == size - staged
    finally:
        await reader.close()
