"""The two service managers behind one interface: which files, which commands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from orchestrator.service import launchd, systemd
from orchestrator.service.spec import ServiceSpec

PlatformName = Literal["launchd", "systemd"]


@dataclass(frozen=True)
class ServiceFile:
    path: Path
    content: bytes
    mode: int
    shown: bytes  # what --dry-run prints: secrets masked


class Platform(Protocol):
    @property
    def name(self) -> PlatformName: ...

    def log_file(self, cluster: str) -> Path: ...
    def files(self, service: ServiceSpec) -> list[ServiceFile]: ...
    def start(self, service: ServiceSpec) -> list[list[str]]: ...
    def stop(self, service: ServiceSpec) -> list[list[str]]: ...
    def state(self, service: ServiceSpec) -> list[str]: ...
    def running(self, state_output: str) -> bool: ...
    def notes(self, service: ServiceSpec) -> list[str]: ...


@dataclass(frozen=True)
class Launchd:
    home: Path  # the user's home: the agent's plist, the log, a daemon's HOME
    name: PlatformName = "launchd"
    daemon_user: str | None = None  # a LaunchDaemon run as this user; None: a LaunchAgent

    @property
    def system(self) -> bool:
        return self.daemon_user is not None

    def log_file(self, cluster: str) -> Path:
        return launchd.log_file(self.home, cluster)

    def plist(self, service: ServiceSpec) -> Path:
        if self.system:
            return launchd.daemon_plist_path(service)
        return launchd.plist_path(self.home, service)

    def files(self, service: ServiceSpec) -> list[ServiceFile]:
        mode = 0o600 if service.secret_names else 0o644
        user, home = self.daemon_user, self.home
        return [ServiceFile(self.plist(service), launchd.render_plist(service, False, user, home),
                            mode, launchd.render_plist(service, True, user, home))]

    def start(self, service: ServiceSpec) -> list[list[str]]:
        return [launchd.bootstrap(self.plist(service), self.system)]

    def stop(self, service: ServiceSpec) -> list[list[str]]:
        return [launchd.bootout(service, self.system)]

    def state(self, service: ServiceSpec) -> list[str]:
        return launchd.print_job(service, self.system)

    def running(self, state_output: str) -> bool:
        return any(line.strip() == "state = running" for line in state_output.splitlines())

    def notes(self, service: ServiceSpec) -> list[str]:
        path = self.plist(service)
        check = (f"check it: plutil -lint '{path}'; "
                 f"launchctl print {launchd.domain(self.system)}/{service.label}")
        if self.system:
            return [f"a LaunchDaemon: starts at boot without a login, runs as "
                    f"{self.daemon_user} (not root)", check]
        return [
            "a launchd agent starts when you log in: for a Mac that must serve after a reboot "
            "without anyone logging in, turn on automatic login (docs/mac-setup.md); macOS's "
            "Local Network privacy may block an agent's connections to the other Macs: "
            "`sudo orchestrator service install --system` makes a LaunchDaemon instead",
            check,
        ]


@dataclass(frozen=True)
class Systemd:
    target: systemd.SystemdTarget
    name: PlatformName = "systemd"

    def log_file(self, cluster: str) -> Path:
        return systemd.log_file(self.target.env_dir, cluster)

    def files(self, service: ServiceSpec) -> list[ServiceFile]:
        unit = systemd.render_unit(service, self.target).encode()
        files = [ServiceFile(self.target.unit_path(service), unit, 0o644, unit)]
        if service.secret_names:
            env = systemd.render_env_file(service).encode()
            shown = b"".join(f'{name}="***"\n'.encode() for name in sorted(service.secret_names))
            files.append(ServiceFile(self.target.env_path(service), env, 0o600, shown))
        return files

    def start(self, service: ServiceSpec) -> list[list[str]]:
        unit = f"{service.label}.service"
        # restart, not start: a reinstall runs the new unit
        return [self.target.systemctl("daemon-reload"), self.target.systemctl("enable", unit),
                self.target.systemctl("restart", unit)]

    def stop(self, service: ServiceSpec) -> list[list[str]]:
        return [self.target.systemctl("disable", "--now", f"{service.label}.service")]

    def state(self, service: ServiceSpec) -> list[str]:
        return self.target.systemctl("is-active", f"{service.label}.service")

    def running(self, state_output: str) -> bool:
        return state_output.strip() == "active"

    def notes(self, service: ServiceSpec) -> list[str]:
        unit = f"{service.label}.service"
        notes = [f"check it: systemd-analyze verify '{self.target.unit_path(service)}'; "
                 f"{' '.join(self.target.systemctl('status', unit))}"]
        if not self.target.system:
            notes.insert(0, "a user unit starts at boot only if you linger: "
                            "loginctl enable-linger $USER")
        else:
            notes.insert(0, "installed as root: a system unit that runs the orchestrator, its "
                            "local agents and ranks (and any model code) as root; to run them "
                            "as an ordinary user, uninstall and install as that user")
        return notes


def platform_for(
    name: PlatformName, home: Path, state_dir: Path, daemon_user: str | None = None
) -> Platform:
    """`daemon_user` (launchd only): a LaunchDaemon run as that user, `home` being theirs."""
    if name == "launchd":
        return Launchd(home, daemon_user=daemon_user)
    return Systemd(systemd.systemd_target(state_dir, home))
