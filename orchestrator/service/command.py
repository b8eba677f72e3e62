"""`orchestrator service install|status|uninstall FILE`: `up` as a service of the OS.

install writes the launchd agent (macOS) or the systemd unit (Linux) and starts it;
--dry-run prints what it would write and run instead. The service manager is run through
`runner`, so tests can see the commands without a launchd or a systemd to run them.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from contract.private_file import write_private
from orchestrator.config import ConfigErrors, check_cluster_file
from orchestrator.config.api_auth import unset_key_issue
from orchestrator.service.platforms import Platform, PlatformName, ServiceFile, platform_for
from orchestrator.service.spec import ServiceError, ServiceSpec, service_spec

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]
EXIT_OK, EXIT_FAILED, EXIT_NOT_INSTALLED = 0, 1, 2


def run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: no answer within 60 s")


def resolve(
    config: Path, name: PlatformName, environ: Mapping[str, str], home: Path,
    installing: bool = True, system: bool = False,
) -> tuple[Platform, ServiceSpec]:
    """The platform and the service for this cluster.toml; ConfigErrors if it is invalid,
    or, when installing, if `up` would refuse to start from the environment the service
    gets (status and uninstall need no key: the installed service holds it). `system`:
    launchd's LaunchDaemon, run as the user who ran sudo."""
    spec, _warnings = check_cluster_file(config)
    if installing and (refusal := unset_key_issue(spec, environ)) is not None:
        raise ConfigErrors(config, [refusal])
    daemon_user = None
    if system:
        if name != "launchd":
            raise ServiceError("--system makes a macOS LaunchDaemon; for systemd, install as "
                               "root for a system unit")
        daemon_user = daemon_account(environ)
        home = Path(pwd.getpwnam(daemon_user).pw_dir)
    platform = platform_for(name, home, spec.state_dir, daemon_user)
    log_file = platform.log_file(spec.cluster.name)
    return platform, service_spec(spec, config, log_file, environ)


def daemon_account(environ: Mapping[str, str]) -> str:
    """Who a LaunchDaemon runs as: the user who ran sudo (as root), else this user (a
    --dry-run or status without sudo); never root."""
    user = environ.get("SUDO_USER", "") if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name
    if not user or user == "root":
        raise ServiceError("a LaunchDaemon runs as the account that ran sudo, never as root: "
                           "run `sudo orchestrator service install --system FILE` from the "
                           "account that should run the cluster")
    return user


def _own_log(platform: Platform, service: ServiceSpec) -> None:
    """A daemon installed as root logs into its user's ~/Library/Logs: that user owns it."""
    service.log_file.parent.mkdir(parents=True, exist_ok=True)
    user = getattr(platform, "daemon_user", None)
    if user is not None and os.geteuid() == 0:
        service.log_file.touch()
        for path in (service.log_file.parent, service.log_file):
            shutil.chown(path, user)


def install(platform: Platform, service: ServiceSpec, dry_run: bool, runner: Runner) -> int:
    files = platform.files(service)
    if dry_run:
        for file in files:
            print(f"# {file.path} (mode {file.mode:o})")
            print(file.shown.decode(), end="" if file.shown.endswith(b"\n") else "\n")
        for argv in platform.start(service):
            print("$ " + " ".join(argv))
        return EXIT_OK
    if getattr(platform, "system", False) and os.geteuid() != 0:
        raise ServiceError(f"a LaunchDaemon goes to {files[0].path.parent}, which needs root: "
                           "sudo orchestrator service install --system FILE")
    if any(file.path.exists() for file in files):  # a reinstall: the old one stops first
        for argv in platform.stop(service):
            runner(argv)
    for file in files:
        write_file(file)
    _own_log(platform, service)
    print(f"wrote {', '.join(str(f.path) for f in files)}")
    if not _run_all(platform.start(service), runner):
        print(f"the file is in place; start it by hand once the above is fixed "
              f"({' && '.join(' '.join(a) for a in platform.start(service))})", file=sys.stderr)
        return EXIT_FAILED
    print(f"started {service.label}: `orchestrator up {service.config}`, logging to "
          f"{service.log_file}")
    for note in platform.notes(service):
        print(note)
    return EXIT_OK


def status(platform: Platform, service: ServiceSpec, runner: Runner) -> int:
    installed = [f.path for f in platform.files(service) if f.path.exists()]
    if not installed:
        print(f"{service.label}: not installed")
        return EXIT_NOT_INSTALLED
    result = runner(platform.state(service))
    running = result.returncode == 0 and platform.running(result.stdout)
    print(f"{service.label}: installed ({', '.join(map(str, installed))}), "
          f"{'running' if running else 'not running'}")
    print(f"$ {' '.join(platform.state(service))}\n{(result.stdout or result.stderr).rstrip()}")
    print(f"log: {service.log_file}")
    for line in _tail(service.log_file, 10):
        print(f"  {line}")
    return EXIT_OK if running else EXIT_FAILED


def uninstall(platform: Platform, service: ServiceSpec, runner: Runner) -> int:
    files = [f.path for f in platform.files(service) if f.path.exists()]
    if not files:
        print(f"{service.label}: not installed; nothing to do")
        return EXIT_OK
    for argv in platform.stop(service):  # stops `up`: its staged stop ends the gang
        result = runner(argv)
        if result.returncode != 0:
            print(f"$ {' '.join(argv)}: {result.stderr.strip() or result.returncode} "
                  "(it may not have been running)", file=sys.stderr)
    for path in files:
        path.unlink()
    if platform.name == "systemd":
        _run_all(platform.start(service)[:1], runner)  # daemon-reload: forget the unit
    print(f"removed {', '.join(map(str, files))}; the log stays at {service.log_file}")
    return EXIT_OK


def write_file(file: ServiceFile) -> None:
    """Atomically, with its mode from the start: a secret is never readable by others."""
    file.path.parent.mkdir(parents=True, exist_ok=True)
    write_private(file.path, file.content, file.mode)


def _run_all(commands: list[list[str]], runner: Runner) -> bool:
    for argv in commands:
        result = runner(argv)
        if result.returncode != 0:
            print(f"$ {' '.join(argv)} failed ({result.returncode}): "
                  f"{(result.stderr or result.stdout).strip()}", file=sys.stderr)
            return False
    return True


def _tail(path: Path, count: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-count:]
    except OSError:
        return []


def add_service_command(commands: argparse._SubParsersAction) -> None:
    """`orchestrator service {install,status,uninstall} FILE`."""
    service = commands.add_parser(
        "service", help="run `up FILE` as a service: systemd (at boot) or launchd (macOS: "
        "at login; --system: at boot)",
        description="Run `orchestrator up FILE` as a service of the OS: started at boot "
        "(macOS: at login as a LaunchAgent; with sudo and --system at boot as a "
        "LaunchDaemon), restarted on failure, logging to a file (docs/operations.md).",
    )
    actions = service.add_subparsers(dest="service_action", metavar="ACTION", required=True)
    helps = {"install": "write the service file and start it",
             "status": "is it installed and running; the log's last lines",
             "uninstall": "stop it and remove its files"}
    for action, help in helps.items():
        sub = actions.add_parser(action, help=help, description=help)
        sub.add_argument("config", type=Path, help="path of cluster.toml")
        sub.add_argument("--platform", choices=["launchd", "systemd"], default=None,
                         help="default: launchd on macOS, systemd on Linux")
        sub.add_argument("--system", action="store_true",
                         help="macOS: a LaunchDaemon (/Library/LaunchDaemons, with sudo): "
                         "starts at boot without a login, runs as the user who ran sudo")
        if action == "install":
            sub.add_argument("--dry-run", action="store_true",
                             help="print the files and commands; write and run nothing")
    service.set_defaults(run=service_main)


def service_main(args: argparse.Namespace, runner: Runner = run_command) -> int:
    name: PlatformName | None = args.platform or _native_platform()
    if name is None:
        print(f"no service manager for {sys.platform}: give --platform", file=sys.stderr)
        return EXIT_FAILED
    try:
        installing = args.service_action == "install"
        platform, service = resolve(args.config, name, os.environ, Path.home(), installing,
                                    args.system)
        if args.service_action == "install":
            return install(platform, service, args.dry_run, runner)
        if args.service_action == "status":
            return status(platform, service, runner)
        return uninstall(platform, service, runner)
    except ServiceError as exc:
        print(f"orchestrator service: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _native_platform() -> PlatformName | None:
    if sys.platform == "darwin":
        return "launchd"
    return "systemd" if sys.platform.startswith("linux") else None
