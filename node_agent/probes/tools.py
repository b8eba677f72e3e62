"""Run a node tool with a timeout; a missing or failing tool becomes a reason, not a crash."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

TOOL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ToolOutput:
    stdout: str | None  # None when the tool could not give an answer
    reason: str | None = None  # why stdout is None

    @property
    def ok(self) -> bool:
        return self.stdout is not None


def run_tool(argv: list[str], timeout: float = TOOL_TIMEOUT_S) -> ToolOutput:
    """stdout of argv (never through a shell), or the reason it is unavailable."""
    exe = shutil.which(argv[0])
    if exe is None:
        return ToolOutput(None, f"{argv[0]} not found on PATH")
    try:
        done = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ToolOutput(None, f"{' '.join(argv)} timed out after {timeout:g} s")
    except OSError as exc:
        return ToolOutput(None, f"{' '.join(argv)} failed to start: {exc}")
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        last = detail[-1] if detail else "no output"
        return ToolOutput(None, f"{' '.join(argv)} exited with {done.returncode}: {last}")
    return ToolOutput(done.stdout)
