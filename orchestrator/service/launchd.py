"""The launchd job (macOS). An agent: ~/Library/LaunchAgents/<label>.plist, loaded into the
user's GUI domain, so it starts when the user logs in (at boot with automatic login), and
subject to Local Network privacy. A daemon (`--system`, installed with sudo):
/Library/LaunchDaemons/<label>.plist in the system domain, started at boot without a login,
run as the user who ran sudo (UserName), never as root; Local Network privacy does not
apply to daemons.

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


DAEMON_DIR = Path("/Library/LaunchDaemons")


def daemon_plist_path(service: ServiceSpec) -> Path:
    return DAEMON_DIR / f"{service.label}.plist"


def log_file(home: Path, cluster: str) -> Path:
    """Where Console.app looks (~/Library/Logs)."""
    return home / "Library" / "Logs" / "mlx-cluster-orchestrator" / f"{cluster}.log"


def plist_data(
    service: ServiceSpec, masked: bool = False, user: str | None = None, home: Path | None = None
) -> dict[str, Any]:
    """`user` (and that user's `home`): a daemon run as that user."""
    data = _job(service, masked)
    if user is not None:
        data["UserName"] = user
        data["InitGroups"] = True  # the user's groups, as at a login
        # A daemon's environment has no HOME: `up` reads it (state dir, SSH keys, caches).
        data["EnvironmentVariables"] = {**data["EnvironmentVariables"], "HOME": str(home)}
    return data


def _job(service: ServiceSpec, masked: bool) -> dict[str, Any]:
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


def render_plist(
    service: ServiceSpec, masked: bool = False, user: str | None = None, home: Path | None = None
) -> bytes:
    """XML plist, keys sorted (plistlib's default): the same bytes for the same service."""
    return plistlib.dumps(plist_data(service, masked, user, home))


def domain(system: bool = False) -> str:
    return "system" if system else f"gui/{os.getuid()}"


def bootstrap(path: Path, system: bool = False) -> list[str]:
    return ["launchctl", "bootstrap", domain(system), str(path)]


def bootout(service: ServiceSpec, system: bool = False) -> list[str]:
    return ["launchctl", "bootout", f"{domain(system)}/{service.label}"]


def print_job(service: ServiceSpec, system: bool = False) -> list[str]:
    return ["launchctl", "print", f"{domain(system)}/{service.label}"]
