"""Commands and file copies on a node, for bootstrap: SSH (an exec channel per command, SFTP
for files) or this machine (`local`). No agent is needed: the node may have no msgspec yet.

Every command is a list of words, each quoted with shlex.quote (a leading `~/` in the
program becomes "$HOME"/...), so no config value is ever read by the shell as syntax.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from orchestrator.config import NodeSpec
from orchestrator.transports.remote_command import remote_python_word
from orchestrator.transports.ssh import SshTransport

PUT_CONCURRENCY = 4


@dataclass(frozen=True)
class Completed:
    returncode: int | None  # None: the command did not exit (killed, channel closed)
    stdout: str
    stderr: str


Progress = Callable[[int, int], None]  # (files done, files in all)


class NodeShell(ABC):
    def __init__(self, node: NodeSpec) -> None:
        self.node = node

    @abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str = "",
        env: dict[str, str] | None = None,
        timeout: float = 600.0,
    ) -> Completed:
        """Run argv on the node; a program missing there gives returncode 127."""

    @abstractmethod
    async def push(self, files: list[Path], remote_dir: str, progress: Progress) -> int:
        """Copy files into remote_dir (absolute), skipping those already there at the same
        size; each lands under a temporary name first. Returns how many were copied."""

    @abstractmethod
    async def write_text(self, path: str, text: str) -> None:
        """Write a small file on the node (absolute path)."""

    async def close(self) -> None:  # noqa: B027 - a no-op for local
        """Release the connection."""


def command_line(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    words = [remote_python_word(argv[0]), *(shlex.quote(a) for a in argv[1:])]
    if env:
        words = ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    return " ".join(words)


class SshShell(NodeShell):
    def __init__(self, node: NodeSpec, transport: SshTransport | None = None) -> None:
        super().__init__(node)
        self._transport = transport or SshTransport(node)

    async def connect(self) -> None:
        await self._transport.connect()

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str = "",
        env: dict[str, str] | None = None,
        timeout: float = 600.0,
    ) -> Completed:
        result = await self._transport.connection.run(
            command_line(argv, env), input=stdin, check=False, timeout=timeout
        )
        return Completed(result.exit_status, _text(result.stdout), _text(result.stderr))

    async def push(self, files: list[Path], remote_dir: str, progress: Progress) -> int:
        copied = 0
        done = 0
        async with self._transport.connection.start_sftp_client() as sftp:
            await sftp.makedirs(remote_dir, exist_ok=True)
            entries = await sftp.readdir(remote_dir)
            present = {_text(entry.filename): entry.attrs.size for entry in entries}
            for name in present:
                if ".part-" in name:  # left by a run that lost the node mid-file
                    with contextlib.suppress(asyncssh.SFTPError):
                        await sftp.remove(f"{remote_dir}/{name}")
            sem = asyncio.Semaphore(PUT_CONCURRENCY)

            async def put(path: Path) -> None:
                nonlocal copied, done
                async with sem:
                    if present.get(path.name) != path.stat().st_size:
                        await _sftp_put(sftp, path, f"{remote_dir}/{path.name}")
                        copied += 1
                    done += 1
                    progress(done, len(files))

            # Every put runs to its end (a lost connection fails them all) before the first
            # error is raised, so none is left unretrieved.
            results = await asyncio.gather(*(put(path) for path in files), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        return copied

    async def write_text(self, path: str, text: str) -> None:
        async with self._transport.connection.start_sftp_client() as sftp:
            tmp = f"{path}.part-{secrets.token_hex(4)}"
            async with sftp.open(tmp, "w") as f:
                await f.write(text)
            await _sftp_replace(sftp, tmp, path)

    async def close(self) -> None:
        await self._transport.close()


async def _sftp_put(sftp: asyncssh.SFTPClient, path: Path, target: str) -> None:
    tmp = f"{target}.part-{secrets.token_hex(4)}"
    try:
        await sftp.put(str(path), tmp)
        await _sftp_replace(sftp, tmp, target)
    except BaseException:
        with contextlib.suppress(Exception):
            await sftp.remove(tmp)
        raise


async def _sftp_replace(sftp: asyncssh.SFTPClient, source: str, target: str) -> None:
    try:
        await sftp.posix_rename(source, target)
    except asyncssh.SFTPOpUnsupported:
        if await sftp.exists(target):
            await sftp.remove(target)
        await sftp.rename(source, target)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value or "")


class LocalShell(NodeShell):
    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str = "",
        env: dict[str, str] | None = None,
        timeout: float = 600.0,
    ) -> Completed:
        program = os.path.expanduser(argv[0])
        try:
            process = await asyncio.create_subprocess_exec(
                program,
                *argv[1:],
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **(env or {})},
            )
        except (FileNotFoundError, PermissionError) as exc:
            return Completed(127, "", str(exc))
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout)
        except BaseException:
            process.kill()  # our own child, by its PID
            await process.wait()
            raise
        return Completed(process.returncode, out.decode(errors="replace"), err.decode())

    async def push(self, files: list[Path], remote_dir: str, progress: Progress) -> int:
        target = Path(remote_dir)
        target.mkdir(parents=True, exist_ok=True)
        for leftover in target.glob("*.part-*"):
            leftover.unlink(missing_ok=True)
        copied = 0
        for done, path in enumerate(files, 1):
            dest = target / path.name
            if dest.resolve() != path.resolve() and (
                not dest.exists() or dest.stat().st_size != path.stat().st_size
            ):
                tmp = target / f"{path.name}.part-{secrets.token_hex(4)}"
                await asyncio.to_thread(shutil.copyfile, path, tmp)
                tmp.replace(dest)
                copied += 1
            progress(done, len(files))
        return copied

    async def write_text(self, path: str, text: str) -> None:
        tmp = Path(f"{path}.part-{secrets.token_hex(4)}")
        tmp.write_text(text)
        tmp.replace(path)


async def open_shell(node: NodeSpec) -> NodeShell:
    if node.transport == "local":
        return LocalShell(node)
    shell = SshShell(node)
    await shell.connect()
    return shell
