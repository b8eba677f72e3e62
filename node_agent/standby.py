"""Standby rank processes: started ahead of a launch, held before their real work.

A standby is spawned with the exact request of a future launch plus
rank_env.STANDBY=1; the program does its slow start-up (interpreter, imports) and then
waits for a line on stdin. Adopting it writes rank_env.STANDBY_GO, so the relaunch that uses it
skips that start-up. The exec-time environment already carries the future launch
id, so reaping by launch id works for adopted processes as for any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from typing import BinaryIO

import msgspec

from contract import rank_env
from contract.agent_protocol import Spawn

log = logging.getLogger("node_agent.standby")



@dataclass
class Standby:
    request: Spawn
    proc: asyncio.subprocess.Process
    log_file: BinaryIO | None

    def serves(self, req: Spawn) -> bool:
        """True if req asks for exactly the process this standby was started as."""
        mine = self.request  # every field but the request id and the standby flag
        return msgspec.structs.replace(req, id=mine.id, standby=mine.standby) == mine

    async def release(self) -> bool:
        """Let it run; False if it is gone (it can then only be discarded)."""
        if self.proc.returncode is not None or self.proc.stdin is None:
            return False
        try:
            self.proc.stdin.write(rank_env.STANDBY_GO.encode() + b"\n")
            await self.proc.stdin.drain()
            self.proc.stdin.close()
        except (ConnectionError, RuntimeError):
            return False
        return True

    def discard(self) -> None:
        """End it: nothing it holds is worth a grace period."""
        log.info("discarding standby rank %d (pid %d)", self.request.rank, self.proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.log_file is not None:
            self.log_file.close()
