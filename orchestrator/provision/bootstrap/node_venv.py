"""Making one node's venv: push the wheels, create, install offline, verify, mark complete.

    wheels (this machine) ──SFTP──▶ <wheel_dir>/<platform key>/*.whl  + lock-<digest>.txt
    <base python> - create VENV            (node_script: a venv without pip, marked "creating")
    VENV/bin/python <pip wheel>/pip install --no-index --find-links <dir> --require-hashes
    VENV/bin/python - verify mlx.core ...   (imports, installed versions)
    VENV/.mlx-cluster-orchestrator-venv.json  {"state": "complete", "lock": ...}  written last

A venv whose marker is not "complete" is half made and is rebuilt by the next run; wheels
already on the node at the right size are not sent again, so an interrupted run resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from orchestrator.provision.bootstrap.node_probe import (
    MARKER_COMPLETE,
    RERUN,
    Action,
    BootstrapError,
    NodeProbe,
    mismatches,
    run_script,
)
from orchestrator.provision.bootstrap.platforms import NodePlatform
from orchestrator.provision.bootstrap.requirements import RANK_MODULES, Pin
from orchestrator.provision.bootstrap.wheels import Wheel
from orchestrator.transports.base import Transport
from orchestrator.transports.files import PART, NodeFiles, write_then_rename

MIB = 1024**2
# Installed files take a little more than the wheels' contents (bytecode, RECORD, scripts).
UNPACKED_MARGIN = 1.7  # measured: 233 MB of wheel contents made a 384 MB venv
PIP_INSTALL_TIMEOUT_S = 1800.0
PUT_CONCURRENCY = 4

Progress = Callable[[int, int], None]  # (files done, files in all)


async def push_files(files: NodeFiles, paths: list[Path], folder: str, progress: Progress) -> int:
    """Copy paths into folder (absolute), skipping those already there at the same size;
    each lands under a temporary name first. Returns how many were copied."""
    await files.makedirs(folder)
    present = await files.listdir(folder)
    for name in present:
        if PART in name:  # left by a run that lost the node mid-file
            with contextlib.suppress(OSError):
                await files.remove(f"{folder}/{name}")
    sem = asyncio.Semaphore(PUT_CONCURRENCY)
    copied = done = 0

    async def put(path: Path) -> None:
        nonlocal copied, done
        async with sem:
            if present.get(path.name) != path.stat().st_size:
                await write_then_rename(files, f"{folder}/{path.name}", partial(files.put, path))
                copied += 1
            done += 1
            progress(done, len(paths))

    # Every put runs to its end (a lost connection fails them all) before the first error
    # is raised, so none is left unretrieved.
    results = await asyncio.gather(*(put(path) for path in paths), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return copied


def lock_digest(platform: NodePlatform, wheels: list[Wheel]) -> str:
    lines = [platform.key, *sorted(f"{w.name}=={w.version} {w.sha256}" for w in wheels)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def lock_text(wheels: list[Wheel]) -> str:
    """A pip requirements file: exact versions, each with its wheel's hash."""
    lines = [f"{w.name}=={w.version} --hash=sha256:{w.sha256}" for w in wheels]
    return "\n".join(sorted(lines)) + "\n"


def check_space(node: str, probe: NodeProbe, wheels: list[Wheel], action: Action) -> None:
    """Refuse before sending anything when the node cannot write or hold the venv."""
    targets = (
        ("venv", probe.venv.path, probe.venv_space),
        ("wheel_dir", probe.wheel_dir, probe.wheel_space),
    )
    for key, path, space in targets:
        if not space.writable:
            fix = (
                f"choose a {key} on a writable disk"
                if "read-only" in space.error.lower()
                else f"choose a {key} the SSH user can write (e.g. under ~), or make it "
                f'theirs: sudo mkdir -p {path} && sudo chown "$USER" {path}'
            )
            raise BootstrapError(node, f"cannot write the {key} {path}: {space.error}", fix)
    need_venv = int(sum(w.unpacked_size for w in wheels) * UNPACKED_MARGIN)
    if action is Action.INSTALL:
        need_venv //= 2  # most of it is there already
    need_wheels = sum(w.size for w in wheels)
    needs = [
        (probe.venv_space, need_venv, "the venv needs"),
        (probe.wheel_space, need_wheels, "its wheels need"),
    ]
    if probe.venv_space.device == probe.wheel_space.device:
        needs = [(probe.venv_space, need_venv + need_wheels, "the venv and its wheels need")]
    for space, need, what in needs:
        if space.free < need:
            raise BootstrapError(
                node,
                f"{what} about {need / MIB:.0f} MiB under {space.dir}, which has "
                f"{space.free / MIB:.0f} MiB free",
                "free some space there, or set [bootstrap] venv / wheel_dir on a larger disk",
            )


async def install(
    transport: Transport,
    node: str,
    probe: NodeProbe,
    action: Action,
    wheel_dir: str,
    wheels: list[Wheel],
    digest: str,
) -> float:
    """Create (or reuse) the venv and install the pushed wheels into it; seconds taken."""
    started = time.monotonic()
    venv = probe.venv.path
    python = f"{venv}/bin/python"
    if action in (Action.CREATE, Action.RECREATE):
        code, out = await run_script(transport, probe.executable, "create", venv)
        if code != 0:
            raise BootstrapError(
                node,
                f"cannot make a venv at {venv} with {probe.executable}: {_tail(out)}",
                "remove that directory, or set venv to another path"
                if code == 3
                else f"check that {probe.executable} -m venv works on the node",
            )
    else:
        await _mark(transport, node, python, venv, {"state": "installing", "lock": digest})
    # The node's own pip config (an index it cannot reach, constraints) must not interfere.
    result = await transport.run(
        pip_install_argv(python, wheel_dir, wheels, digest),
        env={"PIP_CONFIG_FILE": "/dev/null"},
        timeout=PIP_INSTALL_TIMEOUT_S,
    )
    if result.returncode is None:
        raise ConnectionError("the channel closed while pip ran")
    if result.returncode != 0:
        raise BootstrapError(
            node,
            f"pip could not install into {venv}: {_pip_reason(result.stdout + result.stderr)}",
            f"fix what pip reports, then {RERUN} (the half-made venv is rebuilt)"
            + (
                f"; on hash mismatches delete {wheel_dir} on the node first"
                if "HASH" in result.stdout + result.stderr
                else ""
            ),
        )
    return time.monotonic() - started


def pip_install_argv(python: str, wheel_dir: str, wheels: list[Wheel], digest: str) -> list[str]:
    """pip, run from its own pushed wheel, installing the lock's files and nothing else."""
    pip_wheel = next(w for w in wheels if w.name == "pip")
    # --no-compile: bytecode of the few modules a rank imports is written on first import
    # (the verify step does it); compiling all of transformers took most of a minute.
    return [
        python,
        f"{wheel_dir}/{pip_wheel.path.name}/pip",
        "install",
        "--no-index",
        "--find-links",
        wheel_dir,
        "--require-hashes",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--no-input",
        "--no-cache-dir",
        "--no-compile",
        "-r",
        f"{wheel_dir}/lock-{digest}.txt",
    ]


async def verify_and_mark(
    transport: Transport, node: str, venv: str, pins: list[Pin], platform: NodePlatform, digest: str
) -> None:
    """Import what a rank imports with the venv's python, compare versions, mark complete."""
    python = f"{venv}/bin/python"
    code, out = await run_script(transport, python, "verify", *RANK_MODULES, timeout=300.0)
    if code != 0:
        raise BootstrapError(node, f"{python} does not run: {_tail(out)}", RERUN)
    answer = json.loads(out.splitlines()[-1])
    if answer["import_errors"]:
        failed = "; ".join(f"{m}: {e}" for m, e in answer["import_errors"].items())
        raise BootstrapError(
            node,
            f"the new venv cannot import what a rank needs: {failed}",
            "check the node's OS version against the wheels' (macOS 14+ for mlx), then " + RERUN,
        )
    wrong = mismatches(answer["distributions"], pins)
    if wrong:
        raise BootstrapError(node, f"the venv holds other versions: {', '.join(wrong)}", RERUN)
    marker = {
        "state": MARKER_COMPLETE,
        "lock": digest,
        "platform": platform.key,
        "python": platform.python_version,
        "pins": {pin.name: pin.version for pin in pins},
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    await _mark(transport, node, python, venv, marker)


async def _mark(
    transport: Transport, node: str, python: str, venv: str, data: Mapping[str, object]
) -> None:
    code, out = await run_script(transport, python, "finish", venv, json.dumps(data))
    if code != 0:
        raise BootstrapError(node, f"cannot write the venv's marker: {_tail(out)}", RERUN)


def _pip_reason(text: str) -> str:
    errors = [line for line in text.splitlines() if line.startswith("ERROR")]
    return "; ".join(errors)[-600:] or _tail(text)


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-600:] or "no output"
