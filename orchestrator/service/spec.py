"""What the service runs, platform apart: the command, its directory, environment and log.

Everything is absolute: a service starts with no shell, no cwd and a bare PATH, so the
interpreter is this one (`sys.executable`, the venv's own, not resolved: the venv's
symlink is what makes it the venv) and the config is its absolute path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import ClusterSpec

PREFIX = "mlx-cluster-orchestrator"
# Read by `up` or what it runs, and absent from a service's bare environment.
PASSED_ON = ("PATH", "HF_HOME", "HF_HUB_CACHE")


class ServiceError(Exception):
    """The service cannot be written as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ServiceSpec:
    cluster: str
    config: Path  # absolute
    argv: tuple[str, ...]  # absolute interpreter first
    working_dir: Path  # the config's directory: relative paths in it mean what they do by hand
    log_file: Path
    environment: dict[str, str] = field(default_factory=dict)
    secret_names: frozenset[str] = frozenset()  # environment names whose values are secrets
    stop_timeout_s: int = 60  # after SIGTERM (the orchestrator's staged stop), then SIGKILL

    @property
    def label(self) -> str:
        """launchd's Label and systemd's unit name (without .service)."""
        return f"{PREFIX}.{self.cluster}"


def service_spec(
    spec: ClusterSpec, config: Path, log_file: Path, environ: Mapping[str, str]
) -> ServiceSpec:
    """`up`'s command for this cluster; `log_file` is the platform's choice."""
    config = Path(os.path.abspath(config))
    python = os.path.abspath(sys.executable)
    for path in (python, str(config), str(log_file)):
        if "\n" in path or "\r" in path:
            raise ServiceError(f"{path!r} holds a line break: no service file can name it")
    environment = {name: environ[name] for name in PASSED_ON if environ.get(name)}
    secrets: frozenset[str] = frozenset()
    key_name = spec.api.api_key_env
    if key_name and environ.get(key_name):
        environment[key_name] = environ[key_name]
        secrets = frozenset({key_name})
    grace = spec.supervisor.stop_grace_s
    return ServiceSpec(
        cluster=spec.cluster.name,
        config=config,
        argv=(python, "-m", "orchestrator.cli", "up", str(config)),
        working_dir=config.parent,
        log_file=log_file,
        environment=environment,
        secret_names=secrets,
        stop_timeout_s=int(max(60, 3 * grace + 30)),
    )


def shown_environment(service: ServiceSpec) -> dict[str, str]:
    """The environment as --dry-run prints it: secrets masked."""
    return {k: "***" if k in service.secret_names else v for k, v in service.environment.items()}
