"""What bootstrap learns from a node before it changes anything, and what it decides.

venv python (if any) ──probe──▶ NodeProbe ─┐
base python candidates ─probe─▶ NodeProbe ─┴─▶ decide(probe, pins) ─▶ Action
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path

import msgspec

from orchestrator.config import NodeSpec
from orchestrator.provision.bootstrap.platforms import NodePlatform
from orchestrator.provision.bootstrap.requirements import Pin
from orchestrator.transports.base import Transport

SCRIPT = (Path(__file__).parent / "node_script.py").read_text()
MARKER_COMPLETE = "complete"
EXIT_NOT_FOUND = 127


class Space(msgspec.Struct):
    dir: str
    free: int
    device: int
    writable: bool
    error: str


class VenvState(msgspec.Struct):
    path: str
    exists: bool
    is_venv: bool
    empty: bool
    marker: dict[str, object] | None


class NodeProbe(msgspec.Struct):
    """The node_script's `probe` answer."""

    python: NodePlatform
    executable: str
    in_venv: bool
    home: str
    venv: VenvState
    wheel_dir: str
    venv_space: Space
    wheel_space: Space
    distributions: dict[str, str]


class Action(StrEnum):
    UNCHANGED = "unchanged"  # the venv holds every pin already: left alone
    INSTALL = "install"  # a complete venv of ours with other versions: pip changes them
    CREATE = "create"  # no venv (or an empty directory): make one
    RECREATE = "recreate"  # ours but half made or broken: remove and make again
    REFUSE = "refuse"  # a directory bootstrap did not make and cannot use


class BootstrapError(Exception):
    """A node cannot be bootstrapped; says which, why and what to do."""

    def __init__(self, node: str, message: str, fix: str) -> None:
        super().__init__(f"node {node!r}: {message}\n    fix: {fix}")
        self.node = node
        self.message = message
        self.fix = fix


RERUN = "run `orchestrator bootstrap` again: it resumes"


def mismatches(distributions: dict[str, str], pins: list[Pin]) -> list[str]:
    """`name found → wanted` for every pin the venv lacks or holds at another version."""
    return [
        f"{pin.name} {distributions.get(pin.name, 'missing')} → {pin.version}"
        for pin in pins
        if distributions.get(pin.name) != pin.version
    ]


def decide(venv_probe: NodeProbe | None, state: VenvState, pins: list[Pin]) -> Action:
    """What to do with the venv path, given its probe (None: its python does not run)."""
    marker = state.marker
    complete = marker is None or marker.get("state") == MARKER_COMPLETE
    holds_pins = venv_probe is not None and not mismatches(venv_probe.distributions, pins)
    if complete and holds_pins and venv_probe is not None and same_minor(venv_probe.python):
        return Action.UNCHANGED
    if not state.exists or (state.empty and marker is None):
        return Action.CREATE
    if marker is None:
        return Action.REFUSE
    if venv_probe is None or not same_minor(venv_probe.python):
        return Action.RECREATE
    return Action.INSTALL if marker.get("state") == MARKER_COMPLETE else Action.RECREATE


def same_minor(platform: NodePlatform) -> bool:
    return platform.python_minor == f"{sys.version_info.major}.{sys.version_info.minor}"


async def run_script(
    transport: Transport, python: str, *args: str, timeout: float = 120.0
) -> tuple[int | None, str]:
    """(exit status, stdout) of node_script under `python`; 127 when python is missing."""
    result = await transport.run([python, "-", *args], stdin=SCRIPT, timeout=timeout)
    if result.returncode is None:  # no exit status: the channel (or the node) went away
        raise ConnectionError(f"the node closed the channel of `{python} - {args[0]}`")
    if result.returncode == 0:
        return 0, result.stdout
    return result.returncode, (result.stdout + result.stderr).strip()


async def probe(transport: Transport, python: str, venv: str, wheel_dir: str) -> NodeProbe | str:
    """The probe under `python`, or why it could not run there."""
    code, out = await run_script(transport, python, "probe", venv, wheel_dir)
    if code == EXIT_NOT_FOUND:
        return "not found"
    if code != 0:
        return _last_line(out) or f"exited {code}"
    try:
        return msgspec.convert(json.loads(out.splitlines()[-1]), NodeProbe)
    except (ValueError, IndexError, msgspec.ValidationError) as exc:
        return f"unreadable probe answer ({exc})"


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def base_candidates(node: NodeSpec, configured: list[str]) -> list[str]:
    """Interpreters to make the venv from: the configured ones only, else the usual places
    (a non-interactive SSH shell on a Mac searches /usr/bin:/bin only)."""
    if configured:
        return list(dict.fromkeys(configured))
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    names = [
        f"python{minor}",
        f"/opt/homebrew/bin/python{minor}",
        f"/usr/local/bin/python{minor}",
        f"/Library/Frameworks/Python.framework/Versions/{minor}/bin/python{minor}",
        f"/usr/bin/python{minor}",
        "python3",
    ]
    if node.transport == "local":
        names.insert(0, sys.executable)
    return list(dict.fromkeys(names))


async def find_base(
    transport: Transport, node: NodeSpec, configured: list[str], venv: str, wheel_dir: str
) -> NodeProbe:
    """The first candidate whose minor version is ours; else an error listing each tried."""
    tried = []
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = base_candidates(node, configured)
    for candidate in candidates:
        found = await probe(transport, candidate, venv, wheel_dir)
        if isinstance(found, str):
            if found != "not found" or candidate in configured:
                tried.append(f"{candidate}: {found}")
            continue
        if same_minor(found.python) and found.python.implementation == "cpython":
            return found
        tried.append(f"{candidate}: {found.python.implementation} {found.python.python_version}")
    raise BootstrapError(
        node.name,
        f"no CPython {ours} found to make the venv from (the orchestrator runs "
        f"{sys.version.split()[0]}; {'; '.join(tried) or 'none of ' + ', '.join(candidates)}"
        + (" exists)" if not tried else ")"),
        f"install Python {ours} on {node.name} (the python.org installer, or "
        f"`brew install python@{ours}`), or name it in [bootstrap] base_python",
    )
