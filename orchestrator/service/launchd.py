"""The launchd agent (macOS): ~/Library/LaunchAgents/<label>.plist, loaded into the
user's GUI domain, so it starts when the user logs in (at boot with automatic login).

The plist holds the environment, the API key included when the cluster has one, so it
is written owner-only (launchd reads it as that user).
"""

from __future__ import annotations

import os
import plistlib
from pathlib import Path
from typing import Any

from orchestrator.service.spec import ServiceSpec, shown_environment


def plist_path(home: Path, service: ServiceSpec) -> Path:
    return home / "Library" / "LaunchAgents" / f"{service.label}.plist"


def log_file(home: Path, cluster: str) -> Path:
    """Where Console.app looks (~/Library/Logs)."""
    return home / "Library" / "Logs" / "mlx-cluster-orchestrator" / f"{cluster}.log"


def plist_data(service: ServiceSpec, masked: bool = False) -> dict[str, Any]:
    return {
        "Label": service.label,
        "ProgramArguments": list(service.argv),
        "WorkingDirectory": str(service.working_dir),
        "EnvironmentVariables": shown_environment(service) if masked else service.environment,
        "RunAtLoad": True,
        # Restarted when it exits with a failure (or is killed), not after `down` (exit 0).
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,  # seconds between restarts
        # Without it launchd throttles the job's CPU and I/O, and the ranks it starts on
        # this Mac (local nodes) inherit that.
        "ProcessType": "Interactive",
        # SIGTERM starts `up`'s staged stop; SIGKILL only after this.
        "ExitTimeOut": service.stop_timeout_s,
        # launchd would kill what is left of the job's process group when `up` exits: its
        # agents must be free to outlive a crash for adoption (they end their ranks after
        # their grace when nobody adopts them).
        "AbandonProcessGroup": True,
        "StandardOutPath": str(service.log_file),
        "StandardErrorPath": str(service.log_file),
    }


def render_plist(service: ServiceSpec, masked: bool = False) -> bytes:
    """XML plist, keys sorted (plistlib's default): the same bytes for the same service."""
    return plistlib.dumps(plist_data(service, masked))


def domain() -> str:
    return f"gui/{os.getuid()}"


def bootstrap(path: Path) -> list[str]:
    return ["launchctl", "bootstrap", domain(), str(path)]


def bootout(service: ServiceSpec) -> list[str]:
    return ["launchctl", "bootout", f"{domain()}/{service.label}"]


def print_job(service: ServiceSpec) -> list[str]:
    return ["launchctl", "print", f"{domain()}/{service.label}"]
