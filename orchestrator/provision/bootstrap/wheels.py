"""Wheels for a node's platform, fetched once on this machine and kept.

    <cache>/<platform key>/*.whl     e.g. ~/.cache/mlx-cluster-orchestrator/wheels/
                                          macosx_14_0_arm64-cp311/mlx_metal-0.32.4-...whl

`pip download --no-deps --only-binary=:all: --platform ... --python-version X.Y` fetches
exactly the pinned files (the pins come from requirements.py, so pip resolves nothing).
A wheel already in the cache is never fetched again: a second bootstrap asks no index.
`plan()` is the same without downloading: `pip install --dry-run --report` names the file
pip would take for each pin (a Linux machine can check a Mac's set this way).
"""

from __future__ import annotations

import asyncio
import email.parser
import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from orchestrator.provision.bootstrap.platforms import NodePlatform
from orchestrator.provision.bootstrap.requirements import Found, Pin

DEFAULT_WHEEL_CACHE = "~/.cache/mlx-cluster-orchestrator/wheels"
CACHE_ENV = "ORCHESTRATOR_WHEEL_CACHE"
PIP_TIMEOUT_S = 1800.0


class WheelError(Exception):
    """A wheel could not be found or fetched for a platform."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    path: Path
    sha256: str
    size: int
    unpacked_size: int


@dataclass(frozen=True)
class PlannedWheel:
    name: str
    version: str
    filename: str
    url: str
    sha256: str


def cache_root(override: str | None = None) -> Path:
    return Path(override or os.environ.get(CACHE_ENV) or DEFAULT_WHEEL_CACHE).expanduser()


class WheelCache:
    """One platform's wheels on this machine."""

    def __init__(self, root: Path, platform: NodePlatform) -> None:
        self.platform = platform
        self.dir = root / platform.key
        self._rank = {tag: i for i, tag in enumerate(platform.supported_tags())}
        self.downloaded: list[str] = []  # file names fetched by this instance

    def find(self, req: Requirement) -> Path | None:
        """The best cached wheel of req (name, version specifier) for this platform."""
        best: tuple[int, Path] | None = None
        name = canonicalize_name(req.name)
        for path in self.dir.glob("*.whl") if self.dir.is_dir() else ():
            try:
                wheel_name, version, _build, wheel_tags = parse_wheel_filename(path.name)
            except InvalidWheelFilename:
                continue
            if wheel_name != name or not req.specifier.contains(version, prereleases=True):
                continue
            ranks = [self._rank[tag] for tag in wheel_tags if tag in self._rank]
            if ranks and (best is None or min(ranks) < best[0]):
                best = (min(ranks), path)
        return best[1] if best else None

    async def lookup(self, reqs: list[Requirement]) -> list[Found]:
        """requirements.Lookup: what this machine lacks, from the cache, else downloaded."""
        missing = [req for req in reqs if self.find(req) is None]
        if missing:
            await self.download([_spec(req) for req in missing])
        found = []
        for req in reqs:
            path = self.find(req)
            if path is not None:
                version, requires = wheel_metadata(path)
                found.append(Found(canonicalize_name(req.name), version, requires))
        return found

    async def ensure(self, pins: list[Pin]) -> list[Wheel]:
        """A cached wheel for every pin, downloading only those not there yet."""
        reqs = [Requirement(f"{pin.name}=={pin.version}") for pin in pins]
        missing = [str(req) for req in reqs if self.find(req) is None]
        if missing:
            await self.download(missing)
        wheels = []
        for req in reqs:
            path = self.find(req)
            if path is None:
                raise WheelError(f"pip fetched no {self.platform.key} wheel of {req}")
            wheels.append(describe_wheel(path))
        return wheels

    async def download(self, specs: list[str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".tmp-{secrets.token_hex(4)}"
        try:
            await run_pip(["download", "-d", str(tmp), *self._target_options(), *specs], self)
            for path in sorted(tmp.glob("*.whl")):
                path.replace(self.dir / path.name)  # whole files only: a cut download stays out
                self.downloaded.append(path.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _target_options(self) -> list[str]:
        options = ["--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
        for tag in self.platform.pip_platforms():
            options += ["--platform", tag]
        return [
            *options,
            "--python-version",
            self.platform.python_minor,
            "--implementation",
            "cp",
        ]

    async def plan(self, pins: list[Pin]) -> list[PlannedWheel]:
        """The files pip would fetch for the pins, without fetching them."""
        return await _report(self, [f"{pin.name}=={pin.version}" for pin in pins])

    async def plan_lookup(self, reqs: list[Requirement]) -> list[Found]:
        """requirements.Lookup that reads the index's metadata instead of downloading."""
        with tempfile.TemporaryDirectory(prefix="mco-plan-") as tmp:
            report = await _pip_report(self, [_spec(req) for req in reqs], Path(tmp))
        return [
            Found(
                canonicalize_name(item["metadata"]["name"]),
                item["metadata"]["version"],
                list(item["metadata"].get("requires_dist") or []),
            )
            for item in report
        ]


def _spec(req: Requirement) -> str:
    return f"{req.name}{req.specifier}"


async def _report(cache: WheelCache, specs: list[str]) -> list[PlannedWheel]:
    with tempfile.TemporaryDirectory(prefix="mco-plan-") as tmp:
        report = await _pip_report(cache, specs, Path(tmp))
    planned = []
    for item in report:
        info = item["download_info"]
        hashes = info.get("archive_info", {}).get("hashes", {})
        planned.append(
            PlannedWheel(
                name=canonicalize_name(item["metadata"]["name"]),
                version=item["metadata"]["version"],
                filename=info["url"].rsplit("/", 1)[-1],
                url=info["url"],
                sha256=hashes.get("sha256", ""),
            )
        )
    return planned


async def _pip_report(cache: WheelCache, specs: list[str], tmp: Path) -> list[dict[str, Any]]:
    report = tmp / "report.json"
    argv = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report)]
    argv += ["--target", str(tmp / "target"), *cache._target_options(), *specs]
    await run_pip(argv, cache)
    items: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    return items


async def run_pip(args: list[str], cache: WheelCache) -> None:
    """`python -m pip ...` with this interpreter; WheelError carrying pip's own reason."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pip",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), PIP_TIMEOUT_S)
    except BaseException as exc:
        process.kill()  # our own child, by its PID
        await process.wait()
        if isinstance(exc, TimeoutError):
            raise WheelError(f"pip did not finish within {PIP_TIMEOUT_S:g} s") from None
        raise
    if process.returncode != 0:
        text = out.decode(errors="replace")
        if "No module named pip" in text:
            raise WheelError(
                f"this machine's Python ({sys.executable}) has no pip to fetch wheels with: "
                f"{sys.executable} -m ensurepip"
            )
        reasons = [line for line in text.splitlines() if line.startswith("ERROR:")]
        reason = "; ".join(reasons) or text.strip()[-800:]
        raise WheelError(
            f"pip could not fetch wheels for {cache.platform.describe()} "
            f"({cache.platform.key}): {reason}"
        )


def wheel_metadata(path: Path) -> tuple[str, list[str]]:
    """(version, Requires-Dist lines) read from a wheel's METADATA."""
    with _open_wheel(path) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if not names:
            raise WheelError(f"{path} has no METADATA: a broken wheel, delete it")
        message = email.parser.BytesParser().parsebytes(archive.read(min(names, key=len)))
    return str(Version(message["Version"])), list(message.get_all("Requires-Dist") or [])


def describe_wheel(path: Path) -> Wheel:
    name, version, _build, _tags = parse_wheel_filename(path.name)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    with _open_wheel(path) as archive:
        unpacked = sum(info.file_size for info in archive.infolist())
    return Wheel(
        name=name,
        version=str(version),
        path=path,
        sha256=digest.hexdigest(),
        size=path.stat().st_size,
        unpacked_size=unpacked,
    )


def _open_wheel(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise WheelError(f"{path} is not a readable wheel ({exc}): delete it") from exc
