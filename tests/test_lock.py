"""requirements.lock is what this environment holds, so the tests judge the locked versions
(and `orchestrator bootstrap`, which pins the nodes to this environment, gives them those)."""

from __future__ import annotations

import importlib.metadata as metadata
import re
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+) ; (.+?) \\$")


def locked_here() -> dict[str, str]:
    """The lock's pins whose markers hold on this machine."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if (match := PIN.match(line)) and Marker(match.group(3)).evaluate():
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def test_every_locked_package_is_installed_at_its_locked_version() -> None:
    """A venv made by scripts/setup-venv matches the lock; else run scripts/setup-venv."""
    pins = locked_here()
    assert {"mlx", "mlx-lm", "pytest"} <= set(pins)
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    wrong = {
        name: (version, installed.get(name))
        for name, version in pins.items()
        if installed.get(name) != version
    }
    assert not wrong, f"(locked, installed) differ: {wrong}; run scripts/setup-venv"
