"""`init --apply`: run on each host the steps init proposed (layout.steps), in order, as
root: directly when the SSH user is root, else through `sudo -n` (a password prompt
cannot be answered over a non-interactive SSH: say so instead of hanging).

Each step is an argv list; the transport quotes every word with shlex before it reaches
the remote shell, so no probed or configured value runs as code.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable

from orchestrator.init.addressing import Step
from orchestrator.transports.base import Completed

Run = Callable[[list[str]], Awaitable[Completed]]


class ApplyError(Exception):
    """A step failed on a host; the message names the host, the command and its output."""


async def is_root(run: Run) -> bool:
    done = await run(["id", "-u"])
    return done.returncode == 0 and done.stdout.strip() == "0"


def as_root(step: Step, root: bool) -> list[str]:
    return list(step.argv) if root else ["sudo", "-n", *step.argv]


async def apply_steps(target: str, run: Run, steps: list[Step]) -> list[str]:
    """Run the steps; returns what was run, as printed. A step that may fail (a network
    service that exists already) is reported and passed; any other failure stops here."""
    root = await is_root(run)
    done_lines: list[str] = []
    for step in steps:
        argv = as_root(step, root)
        done = await run(argv)
        if done.returncode != 0 and not step.may_fail:
            detail = (done.stderr or done.stdout).strip()
            hint = "" if root else " (passwordless sudo is needed for --apply)"
            raise ApplyError(f"{target}: `{shlex.join(argv)}` failed with exit status "
                             f"{done.returncode}{hint}: {detail[-300:]}")
        outcome = "" if done.returncode == 0 else f"   (exit {done.returncode}, passed)"
        done_lines.append(shlex.join(argv) + outcome)
    return done_lines
