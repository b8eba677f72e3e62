"""Live node telemetry: memory, load and what each of our ranks holds, every few seconds.

The orchestrator asks for it once (`WatchUsage`); the agent then pushes a `NodeUsage`
event per interval over its channel. Collected in a thread: psutil's calls and, on macOS,
`vm_stat` and `sysctl` take milliseconds, which the event loop must not wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
from collections.abc import Awaitable, Callable
from types import ModuleType

from contract.agent_protocol import Message, NodeUsage, RankUsage
from node_agent.probes import macos, system
from node_agent.probes.tools import run_tool

log = logging.getLogger("node_agent.usage")

Emit = Callable[[Message], Awaitable[None]]
RankPids = Callable[[], list[tuple[int, int]]]  # (rank, pid) of the running ranks


class UsageReporter:
    def __init__(self, emit: Emit, rank_pids: RankPids) -> None:
        self._emit, self._rank_pids = emit, rank_pids
        self._task: asyncio.Task[None] | None = None
        self._psutil = system.load_psutil()

    def watch(self, interval_s: float) -> None:
        """Report every interval_s from now on; 0 stops."""
        self.stop()
        if interval_s > 0:
            self._task = asyncio.create_task(self._loop(interval_s))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self, interval_s: float) -> None:
        while True:
            try:
                usage = await asyncio.to_thread(collect, self._psutil, self._rank_pids())
            except Exception:  # telemetry must never take the agent down
                log.exception("collecting node usage failed")
            else:
                if usage is not None:
                    await self._emit(usage)
            await asyncio.sleep(interval_s)


def collect(psutil: ModuleType | None, ranks: list[tuple[int, int]]) -> NodeUsage | None:
    memory = system.memory(psutil)
    if memory is None:
        return None
    usage = NodeUsage(
        memory=memory,
        load_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        cpu_count=os.cpu_count(),
        ranks=[RankUsage(rank=r, pid=p, rss_bytes=_tree_rss(psutil, p)) for r, p in ranks],
    )
    if platform.system() == "Darwin":
        vm_stat = run_tool(["vm_stat"]).stdout
        limit = run_tool(["sysctl", "-n", "iogpu.wired_limit_mb"]).stdout
        with contextlib.suppress(ValueError):  # a missing tool leaves its field empty
            usage.wired_bytes = macos.parse_vm_stat_wired(vm_stat) if vm_stat else None
        with contextlib.suppress(ValueError):
            usage.gpu_wired_limit_mb = macos.parse_sysctl_int(limit) if limit else None
    return usage


def _tree_rss(psutil: ModuleType | None, pid: int) -> int:
    """Resident memory of the rank and every process under it (0 without psutil)."""
    if psutil is None:
        return 0
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return int(total)
