"""The systemd unit (Linux): a user unit, or a system unit when installed as root.

A user unit starts at boot only when the user lingers (`loginctl enable-linger USER`);
`service install` says so. The API key, if any, goes to an owner-only EnvironmentFile,
never into the unit (units are world-readable, and `systemctl show` prints Environment=).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.service.spec import ServiceError, ServiceSpec


@dataclass(frozen=True)
class SystemdTarget:
    system: bool  # root: a system unit, started at boot, run as root
    unit_dir: Path
    env_dir: Path  # the owner-only EnvironmentFile goes here (the cluster's state dir)

    def unit_path(self, service: ServiceSpec) -> Path:
        return self.unit_dir / f"{service.label}.service"

    def env_path(self, service: ServiceSpec) -> Path:
        return self.env_dir / f"{service.cluster}.service.env"

    def systemctl(self, *args: str) -> list[str]:
        return ["systemctl", *([] if self.system else ["--user"]), *args]


def systemd_target(state_dir: Path, home: Path, system: bool | None = None) -> SystemdTarget:
    """Where the unit goes: /etc/systemd/system as root, else the user's unit directory."""
    if system is None:
        system = os.geteuid() == 0
    if system:
        return SystemdTarget(True, Path("/etc/systemd/system"), state_dir)
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    return SystemdTarget(False, Path(config_home) / "systemd" / "user", state_dir)


def log_file(state_dir: Path, cluster: str) -> Path:
    return state_dir / f"{cluster}.log"


def render_unit(service: ServiceSpec, target: SystemdTarget) -> str:
    """The unit file's text; every value quoted or escaped for systemd's parser."""
    public = {k: v for k, v in service.environment.items() if k not in service.secret_names}
    lines = [
        f"# Written by `orchestrator service install` for cluster {service.cluster}.",
        "# Remove with `orchestrator service uninstall` (not by hand: it also stops it).",
        "[Unit]",
        f"Description=mlx-cluster-orchestrator: cluster {service.cluster}",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(
            [quote_executable(service.argv[0]), *(quote_arg(arg) for arg in service.argv[1:])]
        ),
        "WorkingDirectory=" + escape_path(service.working_dir),
        *(f"Environment={quote_env(k, v)}" for k, v in public.items()),
        *([f"EnvironmentFile={escape_path(target.env_path(service))}"]
          if service.secret_names else []),
        f"StandardOutput=append:{escape_path(service.log_file)}",
        f"StandardError=append:{escape_path(service.log_file)}",
        "Restart=on-failure",
        "RestartSec=10",
        # SIGTERM to `up` alone: its staged stop ends the gang on every node. Its agents
        # are not signalled with it, so after a crash they may outlive it for adoption.
        "KillMode=process",
        f"TimeoutStopSec={service.stop_timeout_s}",
        *(["User=root"] if target.system else []),  # sets HOME, which `up` reads
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if target.system else 'default.target'}",
    ]
    return "\n".join(lines) + "\n"


def render_env_file(service: ServiceSpec) -> str:
    """The secrets, in systemd's EnvironmentFile syntax (double-quoted, escaped)."""
    lines = []
    for name in sorted(service.secret_names):
        value = _escape(service.environment[name], "\\", '"', "$", "`")
        lines.append(f'{name}="{value}"\n')
    return "".join(lines)


def quote_executable(path: str) -> str:
    """ExecStart='s first word: no $ expansion there, and systemd refuses quotes and
    backslashes in it (systemd-analyze verify: "Executable name contains special
    characters")."""
    if any(char in path for char in "\"'\\") or not path.isprintable():
        raise ServiceError(
            f"systemd cannot run an interpreter whose path holds a quote, a backslash or a "
            f"control character: {path!r}; make the venv under a plainer path"
        )
    return '"' + path.replace("%", "%%") + '"'


def quote_arg(arg: str) -> str:
    """One ExecStart= word: double-quoted; `$` and `%` would be expanded, so doubled."""
    return '"' + _escape(arg, "\\", '"').replace("%", "%%").replace("$", "$$") + '"'


def quote_env(name: str, value: str) -> str:
    """`"NAME=value"` for Environment= (no $ expansion there; % specifiers are)."""
    return '"' + _escape(f"{name}={value}", "\\", '"').replace("%", "%%") + '"'


def escape_path(path: Path) -> str:
    """A path setting's value: taken as is but for % specifiers."""
    return str(path).replace("%", "%%")


def _escape(text: str, *chars: str) -> str:
    for char in chars:  # the backslash first, so the escapes added after stay single
        text = text.replace(char, "\\" + char)
    return text
