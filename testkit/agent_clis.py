"""The coding-agent CLIs people point at a cluster, run unmodified, with every connection
they attempt recorded (a test and bench helper).

Claude Code, Codex CLI and OpenCode come from tests/clients/package-lock.json (`npm ci`
there; .ci/run does it). Each run gets its own HOME, XDG and config directories under a
temp dir, an environment built from nothing (no proxy, key or setting of the developer's
leaks in), and the settings that turn off its telemetry, update checks and other outside
traffic (docs/clients.md says why each is there).

Every run is traced by strace (-f: the CLI and every process it starts) for connect,
sendto, sendmsg and sendmmsg: each TCP connect and each UDP datagram to an address (a DNS
lookup included) is recorded, whatever the CLI does with proxy variables, so a test can
fail on any destination but the gateway.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testkit.paths import ROOT
from testkit.require import AGENT_CLIS, missing

CLIENTS_DIR = ROOT / "tests" / "clients"  # the npm project pinning the CLIs
BIN = CLIENTS_DIR / "node_modules" / ".bin"
NAMES = ("claude", "codex", "opencode")
# One socket address in strace's rendering of a sockaddr (IPv4 or IPv6).
_ADDRESS = re.compile(
    r"sa_family=AF_INET6?, sin6?_port=htons\((?P<port>\d+)\)"
    r"(?:, sin6_flowinfo=[^,]+)?, "
    r"(?:sin_addr=inet_addr\(\"(?P<v4>[^\"]+)\"\)|inet_pton\(AF_INET6, \"(?P<v6>[^\"]+)\")"
)


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    destinations: list[tuple[str, int]]  # every (address, port) attempted, in order

    def outside(self, allowed: tuple[str, int]) -> list[tuple[str, int]]:
        return [d for d in self.destinations if d != allowed]


def require() -> None:
    """Skip (fail where ORCHESTRATOR_TESTS_REQUIRE_AGENT_CLIS=1) without the CLIs or strace."""
    absent = [name for name in NAMES if not (BIN / name).exists()]
    if absent:
        missing(f"the agent CLIs {absent} are not installed: run `npm ci` in {CLIENTS_DIR}",
                AGENT_CLIS)
    if shutil.which("strace") is None:
        missing("strace is not installed (apt-get install strace)", AGENT_CLIS)
    if shutil.which("node") is None:
        missing("node is not on PATH (.ci/run installs one)", AGENT_CLIS)


def destinations(trace: str) -> list[tuple[str, int]]:
    """The (address, port) of every IP connect or datagram in strace's output."""
    found = []
    for line in trace.splitlines():
        if not re.search(r"\b(connect|sendto|sendmsg|sendmmsg)\(", line):
            continue
        for match in _ADDRESS.finditer(line):
            found.append((match["v4"] or match["v6"], int(match["port"])))
    return found


def base_env(home: Path) -> dict[str, str]:
    """A fresh environment whose every per-user directory is under `home`."""
    for sub in (".config", ".local/share", ".local/state", ".cache", "tmp"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    return {
        "PATH": _path(),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }


def _path() -> str:
    """Where node is (the CI's own, maybe not /usr/bin) and the usual system directories."""
    node = shutil.which("node")
    dirs = [str(Path(node).parent)] if node else []
    return ":".join([*dirs, "/usr/local/bin", "/usr/bin", "/bin"])


def claude(home: Path, url: str, key: str, model: str, window: int) -> dict[str, str]:
    """Claude Code's environment: the gateway, key and model, the window it cannot know."""
    return {
        **base_env(home),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(window),
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


CODEX_CONFIG = """\
model = "{model}"
model_provider = "orchestrator"
check_for_update_on_startup = false

[analytics]
enabled = false

# The curated-plugins sync reaches github.com and chatgpt.com at every start.
[features]
plugins = false
remote_plugin = false
apps = false
plugin_sharing = false
tool_suggest = false
in_app_updates = false

[model_providers.orchestrator]
name = "mlx-cluster-orchestrator"
base_url = "{url}/v1"
env_key = "ORCHESTRATOR_API_KEY"
wire_api = "responses"
"""


def codex(home: Path, url: str, key: str, model: str) -> dict[str, str]:
    """Codex CLI's environment, its provider in $CODEX_HOME/config.toml."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=model, url=url))
    return {**base_env(home), "CODEX_HOME": str(codex_home), "ORCHESTRATOR_API_KEY": key}


def opencode(home: Path, url: str, key: str, model: str, window: int,
             output: int) -> dict[str, str]:
    """OpenCode's environment, the provider in its global opencode.json."""
    env = base_env(home)
    config_dir = home / ".config" / "opencode"
    config_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"orchestrator/{model}",
        "provider": {"orchestrator": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "mlx-cluster-orchestrator",
            "options": {"baseURL": f"{url}/v1", "apiKey": "{env:ORCHESTRATOR_API_KEY}"},
            "models": {model: {"name": model, "limit": {"context": window, "output": output}}},
        }},
    }
    (config_dir / "opencode.json").write_text(json.dumps(config, indent=2))
    # OpenCode npm-installs @opencode-ai/plugin into each config dir at start unless the
    # dir has node_modules and a lock naming every dependency: say it is there.
    (config_dir / "node_modules").mkdir(exist_ok=True)
    dependencies = {"dependencies": {"@opencode-ai/plugin": "*"}}
    (config_dir / "package.json").write_text(json.dumps(dependencies))
    lock = {"lockfileVersion": 3, "packages": {"": dependencies}}
    (config_dir / "package-lock.json").write_text(json.dumps(lock))
    return {
        **env,
        "ORCHESTRATOR_API_KEY": key,
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }


def command(name: str, prompt: str) -> list[str]:
    """The one-shot, non-interactive form of each CLI."""
    forms = {
        "claude": ["-p", prompt],
        "codex": ["exec", "--skip-git-repo-check", prompt],
        "opencode": ["run", prompt],
    }
    return [str(BIN / name), *forms[name]]


def run(argv: list[str], env: dict[str, str], workdir: Path, timeout: float) -> Run:
    """`argv` under strace in `workdir` (stdin closed: codex exec would read it), in its own
    session: at the timeout the whole group goes, not strace alone (its tracees would live)."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir.parent / f"{workdir.name}.strace"
    strace = ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg",
              "-e", "signal=none", "-o", str(trace)]
    process = subprocess.Popen(
        [*strace, *argv], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += f"\n[killed after {timeout} s]"
    return Run(process.returncode, stdout, stderr, destinations(trace.read_text()))
