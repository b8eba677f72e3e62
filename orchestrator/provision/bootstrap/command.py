"""`orchestrator bootstrap cluster.toml`: on every node with a venv, a virtual environment
holding exactly this machine's versions of what a rank imports, installed offline.

    this machine                                   each node (concurrently)
    ────────────                                   ────────────────────────
    probe (node_script) ◀──────── ssh ──────────── venv python, else python3.X candidates
    pins: our installed versions, markers of the node's platform   (requirements.py)
    wheels: <cache>/<platform key>/, pip download once per platform   (wheels.py)
                           ──── files ───────────▶ <wheel_dir>/<key>/ (skips what is there)
                           ──── ssh ─────────────▶ venv, pip install --no-index, verify, mark

A node whose venv already holds every pin is left alone; nothing is downloaded when the
cache has every wheel. Errors name the node and the fix; the next run resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.provision.bootstrap.node_probe import (
    RERUN,
    Action,
    BootstrapError,
    NodeProbe,
    decide,
    find_base,
    probe,
    same_minor,
)
from orchestrator.provision.bootstrap.node_venv import (
    MIB,
    check_space,
    install,
    lock_digest,
    lock_text,
    push_files,
    verify_and_mark,
)
from orchestrator.provision.bootstrap.platforms import NodePlatform, UnsupportedPlatform
from orchestrator.provision.bootstrap.requirements import Pin, ResolutionError, rank_roots, resolve
from orchestrator.provision.bootstrap.wheels import Wheel, WheelCache, WheelError, cache_root
from orchestrator.transports import Transport, transport_for
from orchestrator.transports.errors import TransportError
from orchestrator.transports.files import NodeFiles, write_bytes
from orchestrator.transports.sftp_files import quiet_lost_connections

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
log = logging.getLogger("orchestrator.bootstrap")


@dataclass
class NodeResult:
    node: str
    action: str  # an Action value, "skipped" or "failed"
    python: str
    detail: str = ""
    seconds: float = 0.0
    pushed: int = 0


@dataclass
class Bootstrap:
    """One run over the cluster: the wheel caches and pins it shares between nodes."""

    spec: ClusterSpec
    cache: Path
    dry_run: bool = False
    downloaded: list[str] = field(default_factory=list)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    _pins: dict[str, list[Pin]] = field(default_factory=dict)
    _wheels: dict[str, list[Wheel]] = field(default_factory=dict)

    def say(self, node: str, message: str) -> None:
        print(f"[{node}] {message}", flush=True)

    async def pins(self, platform: NodePlatform) -> list[Pin]:
        async with self._locks.setdefault(platform.key, asyncio.Lock()):
            if platform.key not in self._pins:
                cache = WheelCache(self.cache, platform)
                lookup = cache.plan_lookup if self.dry_run else cache.lookup
                roots = rank_roots(self.spec.model.path)
                self._pins[platform.key] = await resolve(platform.marker_env, roots, lookup)
                self.downloaded += cache.downloaded
            return self._pins[platform.key]

    async def wheels(self, platform: NodePlatform, pins: list[Pin]) -> list[Wheel]:
        async with self._locks.setdefault(platform.key, asyncio.Lock()):
            if platform.key not in self._wheels:
                cache = WheelCache(self.cache, platform)
                self._wheels[platform.key] = await cache.ensure(pins)
                self.downloaded += cache.downloaded
            return self._wheels[platform.key]

    async def node(self, node: NodeSpec) -> NodeResult:
        started = time.monotonic()
        try:
            result = await self._node(node)
        except BootstrapError as exc:
            self.say(node.name, f"FAILED: {exc.message}\n    fix: {exc.fix}")
            return NodeResult(node.name, "failed", node.python_executable, str(exc))
        except TransportError as exc:
            self.say(node.name, f"FAILED: {exc.message}")
            return NodeResult(node.name, "failed", node.python_executable, str(exc))
        except Exception as exc:  # a bug of ours: still one node's failure, not a traceback
            log.debug("bootstrap of %s failed", node.name, exc_info=True)
            self.say(node.name, f"FAILED (internal error, please report): {exc!r}")
            return NodeResult(node.name, "failed", node.python_executable, repr(exc))
        result.seconds = time.monotonic() - started
        return result

    async def _node(self, node: NodeSpec) -> NodeResult:
        transport = transport_for(node)
        await transport.connect()
        step = ["probing the node"]
        try:
            return await self._steps(transport, node, step)
        except (ConnectionError, TimeoutError) as exc:
            raise BootstrapError(
                node.name,
                f"lost the node while {step[0]}: {exc or type(exc).__name__}",
                f"check that {node.name} is up and reachable, then {RERUN}",
            ) from exc
        except OSError as exc:
            raise BootstrapError(node.name, f"failed while {step[0]}: {exc}", RERUN) from exc
        finally:
            with contextlib.suppress(Exception):
                await transport.close()

    async def _steps(self, transport: Transport, node: NodeSpec, step: list[str]) -> NodeResult:
        assert node.venv is not None
        wheel_dir = self.spec.bootstrap.wheel_dir
        found = await probe(transport, node.python_executable, node.venv, wheel_dir)
        venv_probe = found if isinstance(found, NodeProbe) and found.in_venv else None
        if (
            venv_probe is not None
            and same_minor(venv_probe.python)
            and decide(venv_probe, venv_probe.venv, await self._pins_for(node, venv_probe.python))
            is Action.UNCHANGED
        ):
            self.say(node.name, f"{venv_probe.venv.path} already matches: left alone")
            return NodeResult(node.name, Action.UNCHANGED, node.python_executable)
        base_python = self.spec.bootstrap.base_python
        base = await find_base(transport, node, base_python, node.venv, wheel_dir)
        platform = base.python
        pins = await self._pins_for(node, platform)
        action = decide(venv_probe, base.venv, pins)
        self.say(node.name, f"{platform.describe()} ({base.executable}); venv: {action}")
        if action is Action.REFUSE:
            raise BootstrapError(
                node.name,
                f"{base.venv.path} exists and was not made by orchestrator bootstrap",
                "remove it, or set this node's venv (or [bootstrap] venv) to another path",
            )
        if action is Action.UNCHANGED or self.dry_run:
            return await self._plan_only(node, platform, pins, action)
        step[0] = "fetching wheels"
        wheels = await self._wheels_for(node, platform, pins)
        check_space(node.name, base, wheels, action)
        step[0] = "pushing wheels"
        remote = f"{base.wheel_dir}/{platform.key}"
        digest = lock_digest(platform, wheels)
        async with await transport.open_files() as files:
            pushed = await self._push(files, node, wheels, remote)
            await write_bytes(files, f"{remote}/lock-{digest}.txt", lock_text(wheels).encode())
        step[0] = "installing the venv"
        seconds = await install(transport, node.name, base, action, remote, wheels, digest)
        step[0] = "verifying the venv"
        await verify_and_mark(transport, node.name, base.venv.path, pins, platform, digest)
        self.say(node.name, f"installed {len(wheels)} packages in {seconds:.1f} s; ready")
        return NodeResult(node.name, action, node.python_executable, pushed=pushed)

    async def _pins_for(self, node: NodeSpec, platform: NodePlatform) -> list[Pin]:
        try:
            platform.key  # noqa: B018 - raises for a platform without wheels
            if platform.system == "Darwin" and platform.machine != "arm64":
                raise UnsupportedPlatform(
                    f"an {platform.machine} Python on macOS (Rosetta?); MLX needs an arm64 one"
                )
            return await self.pins(platform)
        except UnsupportedPlatform as exc:
            raise BootstrapError(
                node.name,
                f"cannot run MLX: {exc}",
                "use an Apple Silicon Mac with an arm64 Python (or glibc Linux)",
            ) from exc
        except (ResolutionError, WheelError) as exc:
            raise BootstrapError(node.name, str(exc), _wheel_fix(platform)) from exc

    async def _wheels_for(
        self, node: NodeSpec, platform: NodePlatform, pins: list[Pin]
    ) -> list[Wheel]:
        try:
            wheels = await self.wheels(platform, pins)
        except WheelError as exc:
            raise BootstrapError(node.name, str(exc), _wheel_fix(platform)) from exc
        total = sum(w.size for w in wheels)
        self.say(node.name, f"{len(wheels)} wheels for {platform.key} ({total / MIB:.1f} MiB)")
        return wheels

    async def _push(
        self, files: NodeFiles, node: NodeSpec, wheels: list[Wheel], remote: str
    ) -> int:
        started = time.monotonic()
        marks = {len(wheels) * q // 4 for q in (1, 2, 3)}

        def progress(done: int, total: int) -> None:
            if done in marks and total > 20:
                self.say(node.name, f"pushing wheels: {done}/{total}")

        pushed = await push_files(files, [w.path for w in wheels], remote, progress)
        self.say(
            node.name,
            f"pushed {pushed} wheels in {time.monotonic() - started:.1f} s "
            f"({len(wheels) - pushed} already there) to {remote}",
        )
        return pushed

    async def _plan_only(
        self, node: NodeSpec, platform: NodePlatform, pins: list[Pin], action: Action
    ) -> NodeResult:
        cache = WheelCache(self.cache, platform)
        missing = [pin for pin in pins if cache.find(_req(pin)) is None]
        if missing:
            planned = await cache.plan(missing)
            detail = f"{len(pins) - len(missing)} wheels cached, {len(planned)} to download"
        else:
            detail = f"all {len(pins)} wheels cached"
        self.say(node.name, f"would {action}: {detail}")
        return NodeResult(node.name, action, node.python_executable, detail)


def _req(pin: Pin) -> Requirement:
    return Requirement(f"{pin.name}=={pin.version}")


def _wheel_fix(platform: NodePlatform) -> str:
    return (
        "run bootstrap where the package index is reachable (pip's own settings apply), or "
        f"put the wheels for {platform.key} into the wheel cache by hand"
    )


def _nothing_to_bootstrap(spec: ClusterSpec, chosen: list[NodeSpec]) -> str:
    """Why no node has a venv: [bootstrap] venv unset, or every node names its own python
    (or is local), which [bootstrap] venv leaves alone."""
    if spec.bootstrap.venv is None:
        return (
            "nothing to bootstrap: no node has a venv\n    fix: set [bootstrap] venv = "
            '"~/.venvs/mlx-cluster" (every ssh node without its own python), or venv = '
            '"..." in a [[nodes]] table'
        )
    own = [node.name for node in chosen if node.python]
    local = [node.name for node in chosen if node.transport == "local" and not node.python]
    why = "; ".join(
        part
        for part in (
            f"{', '.join(own)} set{'s' if len(own) == 1 else ''} python" if own else "",
            f"{', '.join(local)} {'is' if len(local) == 1 else 'are'} local" if local else "",
        )
        if part
    )
    return (
        f"nothing to bootstrap: [bootstrap] venv applies only to ssh nodes that set no python "
        f"({why})\n    fix: remove python from those [[nodes]] tables so they get "
        f"{spec.bootstrap.venv}, or set venv = \"...\" in a node's table"
    )


def bootstrap(
    spec: ClusterSpec,
    *,
    dry_run: bool = False,
    wheel_cache: str | None = None,
    only: list[str] | None = None,
) -> int:
    """The `bootstrap` command: every node with a venv, concurrently; a summary; exit code."""
    unknown = sorted(set(only or ()) - {node.name for node in spec.nodes})
    if unknown:
        print(f"no node named {', '.join(unknown)} in the cluster", file=sys.stderr)
        return EXIT_CONFIG
    chosen = [node for node in spec.nodes if not only or node.name in only]
    targets = [node for node in chosen if node.venv]
    if not targets:
        print(_nothing_to_bootstrap(spec, chosen), file=sys.stderr)
        return EXIT_CONFIG
    run = Bootstrap(spec, cache_root(wheel_cache), dry_run)
    started = time.monotonic()
    done = asyncio.run(_all(run, targets))
    results = [done.get(node.name) or _skipped(node) for node in chosen]
    _summary(run, results, time.monotonic() - started)
    return EXIT_FAILED if any(r.action == "failed" for r in results) else EXIT_OK


async def _all(run: Bootstrap, nodes: list[NodeSpec]) -> dict[str, NodeResult]:
    asyncio.get_running_loop().set_exception_handler(quiet_lost_connections)
    # Errors are results: every node runs to its end, as in connect-all-then-report.
    results = await asyncio.gather(*(run.node(node) for node in nodes))
    return {result.node: result for result in results}


def _skipped(node: NodeSpec) -> NodeResult:
    why = "python is set" if node.python else "no venv"
    return NodeResult(node.name, "skipped", node.python_executable, f"{why}: not managed")


def _summary(run: Bootstrap, results: list[NodeResult], seconds: float) -> None:
    fetched = f"{len(run.downloaded)} wheels downloaded" if not run.dry_run else "dry run"
    print(f"\nbootstrap: {len(results)} nodes in {seconds:.1f} s; {fetched} (cache {run.cache})")
    width = max(len(r.node) for r in results)
    for r in results:
        extra = f"  ({r.detail})" if r.action == "skipped" or run.dry_run else ""
        pushed = f", {r.pushed} wheels sent" if r.pushed else ""
        timing = f"  {r.seconds:.1f} s{pushed}" if r.action not in ("skipped", "failed") else ""
        print(f"  {r.node:<{width}}  {r.action:<9}  python = {r.python}{timing}{extra}")
    changed = (Action.CREATE, Action.RECREATE, Action.INSTALL)
    if not run.dry_run and any(r.action in changed for r in results):
        print(
            "nodes with a venv run their agent and ranks with <venv>/bin/python: "
            "cluster.toml needs no change"
        )
