"""A node's files (transports/files.py) and commands without an agent, on both transports:
this machine, and a real OpenSSH sshd on 127.0.0.1 over SFTP (the ssh cases start sshd:
run them under the e2e lock)."""

from __future__ import annotations

import os
import pwd
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchestrator.config import NodeSpec
from orchestrator.transports import LocalTransport, NodeFiles, SshTransport, Transport
from orchestrator.transports.files import PART, write_bytes, write_then_rename
from orchestrator.transports.sftp_files import SftpFiles
from testkit.sshd import SshdServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.e2e)])  # ssh: a real sshd
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[Transport]:
    if request.param == "local":
        t: Transport = LocalTransport(NodeSpec(name="here"))
    else:
        sshd: SshdServer = request.getfixturevalue("sshd")
        t = SshTransport(sshd.node())
    async with t:
        yield t


@pytest.fixture
async def files(transport: Transport) -> AsyncIterator[NodeFiles]:
    async with await transport.open_files() as opened:
        yield opened


async def test_writes_at_offsets_and_reads_them_back(files: NodeFiles, tmp_path: Path) -> None:
    """Writes land at their offsets in any order; reads at an offset; b"" past the end."""
    path = str(tmp_path / "f.bin")
    f = await files.open(path, "w", truncate=True)
    await f.write(b"world", 5)
    await f.write(b"hello", 0)
    await f.close()
    assert (tmp_path / "f.bin").read_bytes() == b"helloworld"
    f = await files.open(path, "w")  # no truncate: a resume keeps what is there
    await f.write(b"W", 5)
    await f.close()
    f = await files.open(path, "r")
    assert await f.read(5, 5) == b"World"
    assert await f.read(4, 10) == b""
    await f.close()
    assert 32 << 10 <= files.write_size <= 1 << 20


async def test_stat_rename_remove_link_and_listdir(files: NodeFiles, tmp_path: Path) -> None:
    """stat says missing, size and directory; rename replaces; a hard link shares the file."""
    a, b, c = (str(tmp_path / name) for name in ("a", "b", "c"))
    assert await files.stat(a) is None
    (tmp_path / "a").write_bytes(b"12345")
    (tmp_path / "b").write_bytes(b"old")
    found = await files.stat(a)
    assert found is not None and found.size == 5 and not found.is_dir
    dir_stat = await files.stat(str(tmp_path))
    assert dir_stat is not None and dir_stat.is_dir
    await files.link(a, c)
    assert os.stat(a).st_ino == os.stat(c).st_ino
    await files.rename(a, b)
    assert (tmp_path / "b").read_bytes() == b"12345" and not (tmp_path / "a").exists()
    assert await files.listdir(str(tmp_path)) == {"b": 5, "c": 5}
    await files.remove(c)
    assert await files.listdir(str(tmp_path)) == {"b": 5}


async def test_dirs_put_free_space_and_home(files: NodeFiles, tmp_path: Path) -> None:
    """makedirs makes parents; put copies a file of this machine; remove_tree removes all;
    free space is the file system's; ~ is the user's home."""
    deep = tmp_path / "x" / "y" / "z"
    await files.makedirs(str(deep))
    await files.makedirs(str(deep))  # already there: fine
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(300_000))
    await files.put(source, str(deep / "copy.bin"))
    assert (deep / "copy.bin").read_bytes() == source.read_bytes()
    await files.remove_tree(str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    free = await files.free_bytes(str(tmp_path))
    st = os.statvfs(tmp_path)
    assert free is not None and abs(free - st.f_bavail * st.f_frsize) < 64 << 20
    assert await files.free_bytes(str(tmp_path / "missing")) is None
    homes = {Path.home(), Path(pwd.getpwuid(os.getuid()).pw_dir)}  # $HOME; sshd's passwd
    assert await files.expand("~/a/b") in {str(home / "a" / "b") for home in homes}
    assert await files.expand("/abs/~") == "/abs/~"


async def test_write_then_rename_leaves_whole_files_or_nothing(
    files: NodeFiles, tmp_path: Path
) -> None:
    """A fill that fails leaves target as it was and no temporary; one that succeeds
    replaces target, a file or a directory, and leaves no temporary either."""
    target = str(tmp_path / "t.txt")
    await write_bytes(files, target, b"first")

    async def broken(temporary: str) -> None:
        f = await files.open(temporary, "w", truncate=True)
        await f.write(b"half", 0)
        await f.close()
        raise RuntimeError("lost mid-way")

    with pytest.raises(RuntimeError):
        await write_then_rename(files, target, broken)
    assert (tmp_path / "t.txt").read_bytes() == b"first"
    await write_bytes(files, target, b"second" * 100_000)  # several write requests
    assert (tmp_path / "t.txt").read_bytes() == b"second" * 100_000

    async def folder(temporary: str) -> None:
        await files.makedirs(f"{temporary}/sub")
        await write_bytes(files, f"{temporary}/sub/f", b"x")

    await write_then_rename(files, str(tmp_path / "d"), folder)
    assert (tmp_path / "d" / "sub" / "f").read_bytes() == b"x"
    assert not [p for p in tmp_path.rglob("*") if PART in p.name]


async def test_failures_are_os_errors_naming_the_path(files: NodeFiles, tmp_path: Path) -> None:
    """A missing file, a rename into a missing directory: OSErrors (over SFTP, the message
    names the SFTP status), so callers never see the SSH library's types."""
    with pytest.raises(OSError) as missing:
        await files.open(str(tmp_path / "nope"), "r")
    with pytest.raises(OSError):
        await files.rename(str(tmp_path / "nope"), str(tmp_path / "no" / "dir"))
    if isinstance(files, SftpFiles):
        assert str(missing.value).startswith("SFTP NoSuchFile")


async def test_run_without_an_agent(transport: Transport, tmp_path: Path) -> None:
    """A command's exit, output, stdin and env; a missing program is 127; words are never
    read as shell syntax."""
    done = await transport.run(
        ["sh", "-c", 'read line; echo "$line $WHO"; echo oops >&2; exit 3'],
        stdin="hi\n",
        env={"WHO": "there; touch /tmp/x"},
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "hi there; touch /tmp/x\n", "oops\n")
    missing = await transport.run([str(tmp_path / "no-such-program")])
    assert missing.returncode == 127
    with pytest.raises(TimeoutError):
        await transport.run(["sleep", "2"], timeout=0.5)


@pytest.mark.e2e
async def test_ssh_files_after_the_connection_closed_are_connection_errors(
    sshd: SshdServer, tmp_path: Path
) -> None:
    """Once the node's connection is gone, a file request is a ConnectionError (an OSError):
    what sync and bootstrap report as a lost node."""
    t = SshTransport(sshd.node())
    async with t:
        files = await t.open_files()
        f = await files.open(str(tmp_path / "f"), "w", truncate=True)
        t.connection.close()
        await t.connection.wait_closed()
        with pytest.raises(ConnectionError):
            await f.write(b"x" * 1000, 0)
        with pytest.raises(ConnectionError):
            await files.stat(str(tmp_path))
        await files.close()
