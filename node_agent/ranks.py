"""Rank processes: spawn in their own session, relay output, report exits, stop by group.

Output relay costs nothing while a rank is quiet: each stream is read with
asyncio's `readuntil` on the pipe (the event loop sleeps in the selector until
bytes arrive), never a polling loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO, Literal

from contract import rank_env
from contract.agent_protocol import Exited, Log, Message, RankInfo, Spawn
from contract.process_env import passed_env
from node_agent.host_ops import write_files
from node_agent.pdeathsig import pdeathsig_preexec
from node_agent.standby import Standby

log = logging.getLogger("node_agent.ranks")

LINE_LIMIT = 1 << 20  # longer lines are relayed in pieces
STDERR_TAIL = 40
DRAIN_AFTER_EXIT_S = 2.0  # a grandchild may keep the pipe open; do not wait for it forever

Emit = Callable[[Message], Awaitable[None]]


class SpawnError(Exception):
    pass


class RankProcess:
    def __init__(
        self,
        req: Spawn,
        proc: asyncio.subprocess.Process,
        launch_id: str | None,
        log_file: BinaryIO | None,
    ) -> None:
        self.rank = req.rank
        self.argv = list(req.argv)
        self.proc = proc
        self.pid = proc.pid
        self.launch_id = launch_id
        self.started_at = time.time()
        self.log_file = log_file
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self.stopping = False
        self.exited: asyncio.Future[Exited] = asyncio.get_running_loop().create_future()

    def info(self) -> RankInfo:
        return RankInfo(
            rank=self.rank,
            pid=self.pid,
            launch_id=self.launch_id,
            argv=self.argv,
            started_at=self.started_at,
        )

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the rank's whole process group (its pgid is its pid: new session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


class RankTable:
    """The ranks this agent runs, keyed by rank number."""

    def __init__(self, emit: Emit, code_root: Path) -> None:
        self._emit = emit
        self._code_root = code_root
        self._ranks: dict[int, RankProcess] = {}
        self._standbys: dict[int, Standby] = {}
        self._preexec = pdeathsig_preexec()
        self._watchers: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._ranks)

    def pids(self) -> list[tuple[int, int]]:
        """(rank, pid) of every running rank."""
        return [(rp.rank, rp.pid) for rp in sorted(self._ranks.values(), key=lambda r: r.rank)]

    def wake_workers(self, launch_id: str) -> None:
        """SIGUSR2 to the worker ranks (rank >= 1) of launch_id: ends their idle sleep.
        Only to ranks of that launch: they handle it (serving/rank/idle_wake.py)."""
        for rp in self._ranks.values():
            if rp.rank >= 1 and rp.launch_id == launch_id:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(rp.pid, signal.SIGUSR2)

    def infos(self) -> list[RankInfo]:
        return [rp.info() for rp in sorted(self._ranks.values(), key=lambda r: r.rank)]

    async def spawn(self, req: Spawn) -> RankProcess | Standby:
        """Start req's process, or adopt the standby that was started for it.

        A standby may be started while the rank's current process runs (it is for the
        next launch); a rank process may not.
        """
        if not req.argv:
            raise SpawnError("argv is empty")
        if req.rank in self._ranks and not req.standby:
            raise SpawnError(
                f"rank {req.rank} is already running (pid {self._ranks[req.rank].pid})"
            )
        standby = self._standbys.pop(req.rank, None)
        if req.standby:
            if standby is not None:
                standby.discard()
            standby = Standby(req, *await self._start(req, standby=True))
            self._standbys[req.rank] = standby
            log.info("standby rank %d started: pid %d", req.rank, standby.proc.pid)
            return standby
        if standby is not None:
            if standby.serves(req) and await standby.release():
                log.info("rank %d adopted standby pid %d", req.rank, standby.proc.pid)
                return self._track(req, standby.proc, standby.log_file)
            standby.discard()
        return self._track(req, *await self._start(req, standby=False))

    async def _start(
        self, req: Spawn, standby: bool
    ) -> tuple[asyncio.subprocess.Process, BinaryIO | None]:
        env = self._env(req)
        if standby:
            env[rank_env.STANDBY] = "1"
        argv = [os.path.expanduser(req.argv[0]), *req.argv[1:]]  # python = "~/venv/bin/python"
        cwd = os.path.expanduser(req.cwd) if req.cwd else None
        if req.files:
            if cwd is None:
                raise SpawnError("files need a cwd to be written into")
            try:
                write_files(Path(cwd), req.files)
            except (OSError, ValueError) as exc:
                raise SpawnError(f"cannot write the rank's files into {cwd!r}: {exc}") from exc
        if cwd is not None and not os.path.isdir(cwd):
            raise SpawnError(f"cwd {cwd!r} is not a directory on this node")
        log_file = _open_log(req.log_file)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if standby else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,  # own process group: stop kills what it spawns too
                preexec_fn=self._preexec,
                limit=LINE_LIMIT,
            )
        except (OSError, ValueError) as exc:
            if log_file is not None:
                log_file.close()
            raise SpawnError(f"cannot start {req.argv[0]!r}: {exc}") from exc
        return proc, log_file

    def _track(
        self, req: Spawn, proc: asyncio.subprocess.Process, log_file: BinaryIO | None
    ) -> RankProcess:
        rp = RankProcess(req, proc, self._env(req).get(rank_env.LAUNCH_ID), log_file)
        self._ranks[req.rank] = rp
        task = asyncio.create_task(self._watch(rp), name=f"rank-{req.rank}")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        log.info("rank %d started: pid %d, %s", rp.rank, rp.pid, " ".join(req.argv))
        return rp

    def discard_standbys(self) -> None:
        for standby in self._standbys.values():
            standby.discard()
        self._standbys.clear()

    def _env(self, req: Spawn) -> dict[str, str]:
        # Only what a rank needs of ours (contract/process_env.py): never a secret.
        env = passed_env(os.environ) if req.inherit_env else {}
        env.update(req.env)
        # The deployed code dir first, so `python -m serving` finds the copy this agent runs.
        path = env.get("PYTHONPATH", "")
        root = str(self._code_root)
        if path.split(os.pathsep)[0] != root:
            env["PYTHONPATH"] = root + (os.pathsep + path if path else "")
        env[rank_env.AGENT_PID] = str(os.getpid())
        return env

    async def stop(self, rank: int | None, grace_s: float) -> list[Exited]:
        """SIGTERM each rank's group, SIGKILL after grace_s; returns once all are gone."""
        targets = list(self._ranks.values()) if rank is None else [self._ranks[rank]]
        return list(await asyncio.gather(*(self._stop_one(rp, grace_s) for rp in targets)))

    def has(self, rank: int) -> bool:
        return rank in self._ranks

    def rank_of(self, pid: int, launch_id: str) -> int | None:
        """The rank number of our process pid of launch_id, if it is one."""
        for rp in self._ranks.values():
            if rp.pid == pid and rp.launch_id == launch_id:
                return rp.rank
        return None

    async def _stop_one(self, rp: RankProcess, grace_s: float) -> Exited:
        rp.stopping = True
        log.info("rank %d: SIGTERM to process group %d", rp.rank, rp.pid)
        rp.signal_group(signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.shield(rp.exited), grace_s)
        except TimeoutError:
            log.warning("rank %d: still alive %.1f s after SIGTERM, SIGKILL", rp.rank, grace_s)
            rp.signal_group(signal.SIGKILL)
            return await rp.exited

    async def _watch(self, rp: RankProcess) -> None:
        assert rp.proc.stdout is not None and rp.proc.stderr is not None
        readers = [
            asyncio.create_task(self._relay(rp, rp.proc.stdout, "stdout")),
            asyncio.create_task(self._relay(rp, rp.proc.stderr, "stderr")),
        ]
        returncode = await rp.proc.wait()
        # Anything left in its group (a child that ignored SIGTERM, say) goes now.
        rp.signal_group(signal.SIGKILL)
        _done, pending = await asyncio.wait(readers, timeout=DRAIN_AFTER_EXIT_S)
        for task in pending:
            task.cancel()
        if rp.log_file is not None:
            rp.log_file.close()
        exited = Exited(
            rank=rp.rank,
            pid=rp.pid,
            launch_id=rp.launch_id,
            returncode=returncode if returncode >= 0 else None,
            signal=signal_name(returncode),
            stopped=rp.stopping,
            stderr_tail=list(rp.stderr_tail),
        )
        log.info("rank %d (pid %d) exited: %s", rp.rank, rp.pid, exited.signal or returncode)
        if self._ranks.get(rp.rank) is rp:
            del self._ranks[rp.rank]
        rp.exited.set_result(exited)
        with contextlib.suppress(ConnectionError):
            await self._emit(exited)

    async def _relay(
        self, rp: RankProcess, stream: asyncio.StreamReader, name: Literal["stdout", "stderr"]
    ) -> None:
        while True:
            try:
                data = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                data = exc.partial  # last line without newline, or b"" at EOF
            except asyncio.LimitOverrunError:
                data = await stream.read(LINE_LIMIT)
            if not data:
                return
            if rp.log_file is not None:
                rp.log_file.write(data if data.endswith(b"\n") else data + b"\n")
            line = data.decode("utf-8", errors="replace").rstrip("\r\n")
            if name == "stderr":
                rp.stderr_tail.append(line)
            with contextlib.suppress(ConnectionError):
                await self._emit(Log(rank=rp.rank, stream=name, line=line))


def _open_log(path: str | None) -> BinaryIO | None:
    if not path:
        return None
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.open("ab", buffering=0)
    except OSError as exc:
        raise SpawnError(f"cannot open log file {str(target)!r}: {exc}") from exc


def signal_name(returncode: int) -> str | None:
    """Negative asyncio/subprocess return codes mean "killed by signal -rc"."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"SIG{-returncode}"
