"""Hosts replayed from recorded tool outputs (tests/fixtures/macs/<scenario>/<host>/<key>.txt),
run through `orchestrator init`'s own probe: a key with no file is a tool the host lacks
(exit 127, as a shell says)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestrator.init.probe import HostProbe, Runner, probe_host
from orchestrator.transports import Completed
from testkit.paths import FIXTURES

MACS = FIXTURES / "macs"


def recorded_runner(folder: Path) -> Runner:
    async def run(key: str, argv: list[str]) -> Completed:
        file = folder / f"{key}.txt"
        if not file.is_file():
            return Completed(127, "", f"zsh:1: command not found: {argv[0]}")
        return Completed(0, file.read_text(), "")

    return run


def recorded_hosts(scenario: str, targets: dict[str, str]) -> list[HostProbe]:
    """targets: recorded host folder -> the SSH target it stands for, in the given order."""

    async def probe_all() -> list[HostProbe]:
        return list(await asyncio.gather(*(
            probe_host(target, recorded_runner(MACS / scenario / folder), "python3")
            for folder, target in targets.items()
        )))

    return asyncio.run(probe_all())
