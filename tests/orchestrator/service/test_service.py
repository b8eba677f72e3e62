"""`orchestrator service`: the launchd plist and the systemd unit it writes, checked
against recorded examples and by systemd's own verifier; install, status and uninstall
against a scripted service manager (neither launchd nor a running systemd is here)."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import ConfigErrors
from orchestrator.service import launchd, systemd
from orchestrator.service.command import install, resolve, status, uninstall
from orchestrator.service.platforms import Launchd, Systemd
from orchestrator.service.spec import ServiceError, ServiceSpec
from testkit import paths
from testkit.orchestrator_process import ROOT, write_cluster
from testkit.require import SYSTEMD, missing

FIXTURES = paths.FIXTURES / "service"
KEY = 'k-1"$`\\%'  # every character the env file and the unit must escape
HOME = Path("/Users/ada")
CONFIGS = HOME / "Cluster Configs"
# A Mac's agent as recorded in tests/fixtures/service/: spaces, & and < in its values.
EXAMPLE = ServiceSpec(
    cluster="studio-pair",
    config=CONFIGS / "studio pair.toml",
    argv=(str(HOME / "My Venvs/mlxco/bin/python"), "-m", "orchestrator.cli", "up",
          str(CONFIGS / "studio pair.toml")),
    working_dir=CONFIGS,
    log_file=launchd.log_file(HOME, "studio-pair"),
    environment={"PATH": "/opt/homebrew/bin:/usr/bin:/bin", "HF_HOME": "/Users/ada/hf & <models>"},
)


class Recorder:
    """The service manager's commands, answered as scripted (default: success)."""

    def __init__(self, answers: dict[str, str] | None = None) -> None:
        self.commands: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.commands.append(argv)
        verb = next((a for a in argv[1:] if not a.startswith("-")), "")
        return subprocess.CompletedProcess(argv, 0, self.answers.get(verb, ""), "")


def test_the_plist_is_the_recorded_example_and_round_trips() -> None:
    """Byte for byte the recorded plist; plistlib reads back exactly what was meant."""
    expected = (FIXTURES / "studio-pair.plist").read_bytes()
    assert launchd.render_plist(EXAMPLE) == expected
    data = plistlib.loads(expected)
    assert data == launchd.plist_data(EXAMPLE)
    assert data["ProgramArguments"][-1] == "/Users/ada/Cluster Configs/studio pair.toml"
    assert data["KeepAlive"] == {"SuccessfulExit": False} and data["RunAtLoad"] is True
    assert data["StandardOutPath"] == data["StandardErrorPath"] == (
        "/Users/ada/Library/Logs/mlx-cluster-orchestrator/studio-pair.log")


def test_the_unit_is_the_recorded_example() -> None:
    """The same service as a user unit on Linux, byte for byte."""
    linux = ServiceSpec(**{**EXAMPLE.__dict__, "log_file": Path("/home/ada/state/studio-pair.log")})
    target = systemd.SystemdTarget(False, Path("/home/ada/.config/systemd/user"),
                                   Path("/home/ada/state"))
    assert systemd.render_unit(linux, target) == (FIXTURES / "studio-pair.service").read_text()


def verify(unit: Path, user: bool = False) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify, as the system's manager or (user) a user's would load it."""
    if shutil.which("systemd-analyze") is None:
        missing("no systemd-analyze: apt-get install systemd", SYSTEMD)
    env = dict(os.environ)
    if user:  # a user manager needs its runtime directory, which no login made here
        runtime = unit.parent / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    argv = ["systemd-analyze", *(["--user"] if user else []), "verify", str(unit)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)


@pytest.mark.parametrize("system", [False, True], ids=["user", "system"])
def test_systemd_analyze_verifies_the_unit_with_awkward_paths(tmp_path: Path, system: bool) -> None:
    """Paths with spaces, % and $ (an interpreter among them, which verify checks is
    executable as systemd parses it) and a key with quotes: systemd accepts the unit."""
    odd = tmp_path / "a dir%x $HOME"
    odd.mkdir()
    python = odd / "py thon"
    python.symlink_to(sys.executable)
    config = write_cluster(odd, "bundled:smollm2-135m-instruct", [{"name": "a"}],
                           api={"api_key_env": "SVC_KEY"})
    _platform, service = resolve(config, "systemd", {"SVC_KEY": KEY, "PATH": "/bin"}, tmp_path)
    service = ServiceSpec(**{**service.__dict__, "argv": (str(python), *service.argv[1:])})
    platform = Systemd(systemd.SystemdTarget(system, tmp_path / "units", odd / "state"))
    assert install(platform, service, dry_run=False, runner=Recorder()) == 0
    result = verify(platform.target.unit_path(service), user=not system)
    assert result.returncode == 0, result.stdout + result.stderr
    unit = platform.target.unit_path(service).read_text()
    assert KEY not in unit and "EnvironmentFile=" in unit
    env_file = platform.target.env_path(service)
    assert env_file.read_text() == 'SVC_KEY="k-1\\"\\$\\`\\\\%"\n'
    assert env_file.stat().st_mode & 0o777 == 0o600


def test_verify_catches_a_unit_systemd_would_refuse(tmp_path: Path) -> None:
    """The check is real: an interpreter that does not exist fails it."""
    unit = tmp_path / "x.service"
    unit.write_text("[Service]\nExecStart=/nonexistent/python -m orchestrator.cli\n")
    assert verify(unit).returncode != 0


def test_an_interpreter_path_systemd_cannot_run_is_refused() -> None:
    with pytest.raises(ServiceError, match="quote"):
        systemd.quote_executable('/opt/my "venv"/bin/python')


def test_install_status_uninstall_on_launchd(tmp_path: Path) -> None:
    """install writes the plist (0600: it holds the key) and bootstraps it; status reads
    launchctl print; uninstall boots it out and removes the file, keeping the log."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}],
                           api={"api_key_env": "SVC_KEY"})
    platform, service = resolve(config, "launchd", {"SVC_KEY": KEY}, tmp_path)
    assert isinstance(platform, Launchd)
    manager = Recorder({"print": "gui/501/x = {\n\tstate = running\n\tpid = 4242\n}\n"})
    assert install(platform, service, dry_run=False, runner=manager) == 0
    plist = launchd.plist_path(tmp_path, service)
    assert plist.stat().st_mode & 0o777 == 0o600
    assert plistlib.loads(plist.read_bytes())["EnvironmentVariables"]["SVC_KEY"] == KEY
    assert service.argv[0] == os.path.abspath(sys.executable)
    assert Path(service.argv[-1]).is_absolute()
    assert manager.commands == [["launchctl", "bootstrap", f"gui/{os.getuid()}", str(plist)]]
    assert status(platform, service, manager) == 0
    assert uninstall(platform, service, manager) == 0
    assert manager.commands[-1] == ["launchctl", "bootout", f"gui/{os.getuid()}/{service.label}"]
    assert not plist.exists() and service.log_file.parent.is_dir()
    assert status(platform, service, manager) == 2


def test_reinstalling_a_systemd_unit_restarts_it(tmp_path: Path) -> None:
    """daemon-reload, enable, restart; a second install stops the old one first."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}])
    _platform, service = resolve(config, "systemd", {}, tmp_path)
    platform = Systemd(systemd.SystemdTarget(False, tmp_path / "units", tmp_path / "state"))
    manager = Recorder({"is-active": "inactive\n"})
    install(platform, service, dry_run=False, runner=manager)
    install(platform, service, dry_run=False, runner=manager)
    unit = f"{service.label}.service"
    start = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", unit],
             ["systemctl", "--user", "restart", unit]]
    assert manager.commands == [*start, ["systemctl", "--user", "disable", "--now", unit], *start]
    assert platform.target.unit_path(service).stat().st_mode & 0o777 == 0o644
    assert status(platform, service, manager) == 1  # installed, not running


def test_dry_run_writes_nothing_and_masks_the_key(tmp_path: Path) -> None:
    """--dry-run prints the file and the commands; the key shows as ***."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}],
                           api={"api_key_env": "SVC_KEY"})
    env = {**os.environ, "SVC_KEY": KEY, "HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "service", "install", "--dry-run",
         "--platform", "launchd", str(config)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert KEY not in result.stdout and "<string>***</string>" in result.stdout
    assert "$ launchctl bootstrap" in result.stdout
    assert not (tmp_path / "home").exists()


def test_install_refuses_what_up_would_refuse(tmp_path: Path) -> None:
    """An API beyond loopback whose key is unset here would never start: refused now."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}],
                           api={"api_key_env": "SVC_KEY", "host": "0.0.0.0"})
    with pytest.raises(ConfigErrors, match="SVC_KEY"):
        resolve(config, "systemd", {}, tmp_path)


@pytest.mark.parametrize(("grace", "timeout"), [(3.0, 60), (10.0, 60), (20.0, 90), (45.5, 166)])
def test_a_resolved_service_waits_for_the_staged_stop_and_passes_on_path_and_hf(
    tmp_path: Path, grace: float, timeout: int
) -> None:
    """From a cluster.toml and an environment: the stop timeout is 3 x stop_grace_s + 30 s,
    at least 60 (in the unit and the plist); PATH, HF_HOME, HF_HUB_CACHE are passed on, the
    rest of the caller's environment is not."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}],
                           supervisor={"stop_grace_s": grace})
    environ = {"PATH": "/opt/bin:/bin", "HF_HOME": "/hf home", "HF_HUB_CACHE": "/hf/hub",
               "HOME": "/home/ada", "VIRTUAL_ENV": "/venv", "HF_TOKEN": "hf_x"}
    _platform, service = resolve(config, "systemd", environ, tmp_path)
    assert service.stop_timeout_s == timeout
    assert service.environment == {k: environ[k] for k in ("PATH", "HF_HOME", "HF_HUB_CACHE")}
    unit = systemd.render_unit(
        service, systemd.SystemdTarget(False, tmp_path / "units", tmp_path / "state"))
    assert f"TimeoutStopSec={timeout}\n" in unit
    assert 'Environment="HF_HUB_CACHE=/hf/hub"' in unit and "HF_TOKEN" not in unit
    _platform, service = resolve(config, "launchd", environ, tmp_path)
    plist = plistlib.loads(launchd.render_plist(service))
    assert plist["ExitTimeOut"] == timeout
    assert plist["EnvironmentVariables"] == service.environment


def test_install_as_root_says_everything_runs_as_root() -> None:
    """A system unit's notes say the orchestrator, agents, ranks and model code run as root
    and how to run them as a user; a user unit's do not."""
    from orchestrator.service.platforms import Systemd

    system = Systemd(systemd.SystemdTarget(True, Path("/etc/systemd/system"), Path("/s")))
    user = Systemd(systemd.SystemdTarget(False, Path("/home/ada/.config/systemd/user"),
                                         Path("/s")))
    assert "ranks (and any model code) as root" in " ".join(system.notes(EXAMPLE))
    assert "install as that user" in " ".join(system.notes(EXAMPLE))
    assert "as root" not in " ".join(user.notes(EXAMPLE))


def _daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Launchd, ServiceSpec]:
    """`sudo orchestrator service install --system` by `nobody`, whose home is tmp_path/home
    (pwd's answer for it replaced: no real home is written), plists under tmp_path."""
    import pwd

    monkeypatch.setattr(launchd, "DAEMON_DIR", tmp_path / "LaunchDaemons")
    real = pwd.getpwnam("nobody")
    fake = pwd.struct_passwd((*real[:5], str(tmp_path / "home"), real[6]))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: fake if name == "nobody" else real)
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}],
                           api={"api_key_env": "SVC_KEY"})
    platform, service = resolve(config, "launchd", {"SVC_KEY": KEY, "SUDO_USER": "nobody"},
                                Path("/var/root"), system=True)
    assert isinstance(platform, Launchd)
    return platform, service


def test_system_makes_a_launch_daemon_run_as_the_sudo_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--system: /Library/LaunchDaemons/<label>.plist that plistlib reads back with
    UserName (the sudo user, never root), InitGroups, that user's HOME and log, absolute
    paths; loaded into the system domain; owner-only (it holds the key)."""
    if os.geteuid() != 0:
        pytest.skip("the daemon path is taken as root (sudo)")
    platform, service = _daemon(tmp_path, monkeypatch)
    [file] = platform.files(service)
    assert file.path == tmp_path / "LaunchDaemons" / f"{service.label}.plist"
    data = plistlib.loads(file.content)
    assert data["UserName"] == "nobody" and data["InitGroups"] is True
    assert data["EnvironmentVariables"]["HOME"] == str(tmp_path / "home")
    assert data["EnvironmentVariables"]["SVC_KEY"] == KEY
    assert plistlib.loads(file.shown)["EnvironmentVariables"]["SVC_KEY"] == "***"
    log = tmp_path / "home" / "Library" / "Logs" / "mlx-cluster-orchestrator"
    assert Path(data["StandardOutPath"]).parent == log
    assert all(Path(p).is_absolute() for p in (data["ProgramArguments"][0],
                                                data["ProgramArguments"][-1],
                                                data["WorkingDirectory"]))
    manager = Recorder({"print": "system/x = {\n\tstate = running\n}\n"})
    assert install(platform, service, dry_run=False, runner=manager) == 0
    assert manager.commands == [["launchctl", "bootstrap", "system", str(file.path)]]
    assert file.path.stat().st_mode & 0o777 == 0o600
    assert log.stat().st_uid == Path(service.log_file).stat().st_uid == _uid("nobody")
    assert status(platform, service, manager) == 0
    assert uninstall(platform, service, manager) == 0
    assert manager.commands[-1] == ["launchctl", "bootout", f"system/{service.label}"]
    assert "runs as nobody (not root)" in " ".join(platform.notes(service))


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid  # still the patched answer: the same uid


def test_a_launch_daemon_never_runs_as_root(tmp_path: Path) -> None:
    """As root without SUDO_USER (or SUDO_USER=root): refused, saying how; --system with
    systemd: refused."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", [{"name": "a"}])
    if os.geteuid() == 0:
        for environ in ({}, {"SUDO_USER": "root"}):
            with pytest.raises(ServiceError, match="never as root"):
                resolve(config, "launchd", environ, tmp_path, system=True)
    with pytest.raises(ServiceError, match="install as root for a system unit"):
        resolve(config, "systemd", {}, tmp_path, system=True)
