"""`init --apply` on recorded Macs: the exact commands it runs, in order, as root or
through sudo; a failing step stops it naming the host (the transport is a recorder)."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.init.apply import ApplyError, apply_steps
from orchestrator.init.command import node_names
from orchestrator.init.layout import plan_layout
from orchestrator.transports import Completed
from testkit.recorded_hosts import recorded_hosts

PAIR = {"studio-a": "me@studio-a.local", "studio-b": "me@studio-b.local"}


class Recorder:
    """Answers `id -u` with uid, fails argv[fail_at] (when set), records every argv."""

    def __init__(self, uid: str, fail: str | None = None) -> None:
        self.uid, self.fail, self.ran = uid, fail, list[list[str]]()

    async def __call__(self, argv: list[str]) -> Completed:
        self.ran.append(argv)
        if argv == ["id", "-u"]:
            return Completed(0, f"{self.uid}\n", "")
        if self.fail and self.fail in argv:
            return Completed(4, "", f"** Error: {self.fail} failed")
        return Completed(0, "", "")


def studio_a_steps():  # type: ignore[no-untyped-def]
    hosts = recorded_hosts("studio-pair-tb5-rdma", PAIR)
    return plan_layout(hosts, node_names(list(PAIR.values()))).steps[0]


def test_apply_on_a_mac_runs_the_printed_commands_through_sudo() -> None:
    """Not root: each step is `sudo -n` + the printed argv, every value its own word."""
    run = Recorder("501")
    asyncio.run(apply_steps("me@studio-a.local", run, studio_a_steps()))
    assert run.ran == [
        ["id", "-u"],
        ["sudo", "-n", "ifconfig", "bridge0", "deletem", "en2"],
        ["sudo", "-n", "networksetup", "-createnetworkservice", "TB en2 to studio-b",
         "Thunderbolt 1"],
        ["sudo", "-n", "networksetup", "-setmanual", "TB en2 to studio-b", "10.10.1.1",
         "255.255.255.252", ""],
    ]


def test_apply_as_root_runs_them_without_sudo_and_passes_an_existing_service() -> None:
    """Root: no sudo; -createnetworkservice failing (the service exists) is passed."""
    run = Recorder("0", fail="-createnetworkservice")
    ran = asyncio.run(apply_steps("me@studio-a.local", run, studio_a_steps()))
    assert run.ran[-1] == ["networksetup", "-setmanual", "TB en2 to studio-b", "10.10.1.1",
                           "255.255.255.252", ""]
    assert ran[1].endswith("(exit 4, passed)")


def test_a_failing_step_stops_apply_and_names_host_and_command() -> None:
    """-setmanual failing: ApplyError with the host, the command and passwordless sudo."""
    run = Recorder("501", fail="-setmanual")
    with pytest.raises(ApplyError, match=r"me@studio-a.local: `sudo -n networksetup "
                       r"-setmanual 'TB en2 to studio-b' .*passwordless sudo"):
        asyncio.run(apply_steps("me@studio-a.local", run, studio_a_steps()))
