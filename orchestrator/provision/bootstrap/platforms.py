"""A node's Python platform, as wheels and environment markers see it.

    probe on the node (base python) ──▶ NodePlatform ──▶ pip_platforms()  pip download --platform
                                                     ├─▶ supported_tags()  which cached wheel fits
                                                     ├─▶ marker_env        which requirements apply
                                                     └─▶ key               the wheel cache directory

pip expands one `macosx_X_0_arm64` into every older macOS it runs on, but takes
`manylinux_2_N` literally, so Linux gets the whole list down to glibc 2.5 spelled out.
"""

from __future__ import annotations

import platform
import sys

import msgspec
from packaging import tags

# manylinux_2_N aliases from PEP 600: pip and packaging accept both spellings.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


class NodePlatform(msgspec.Struct, frozen=True, kw_only=True):
    """What decides which wheels a node can install (the probe script's `platform` object)."""

    python_version: str  # "3.11.7"
    implementation: str  # "cpython"
    system: str  # "Darwin" | "Linux"
    machine: str  # "arm64" | "x86_64" | "aarch64"
    mac_version: str = ""  # "14.5" on macOS
    glibc_version: str = ""  # "2.36" on glibc Linux
    marker_env: dict[str, str] = msgspec.field(default_factory=dict)  # PEP 508 environment

    @property
    def python_minor(self) -> str:
        return ".".join(self.python_version.split(".")[:2])

    @property
    def cp_tag(self) -> str:
        return "cp" + self.python_minor.replace(".", "")

    def base_tag(self) -> str:
        """The node's own platform tag: `macosx_14_0_arm64`, `manylinux_2_36_x86_64`."""
        if self.system == "Darwin":
            major, minor = _mac_version(self.mac_version)
            return f"macosx_{major}_{minor}_{self.machine}"
        if self.system == "Linux":
            if not self.glibc_version:
                raise UnsupportedPlatform(
                    f"Linux without glibc ({self.machine}); MLX publishes manylinux wheels only"
                )
            major, minor = _glibc(self.glibc_version)
            return f"manylinux_{major}_{minor}_{self.machine}"
        raise UnsupportedPlatform(f"{self.system} {self.machine}; MLX runs on macOS and Linux")

    @property
    def key(self) -> str:
        """Directory name of this platform's wheels: `macosx_14_0_arm64-cp311`."""
        return f"{self.base_tag()}-{self.cp_tag}"

    def pip_platforms(self) -> list[str]:
        """--platform values for pip (each one a separate option)."""
        base = self.base_tag()
        if self.system == "Darwin":
            return [base]
        return self._linux_platforms()

    def _linux_platforms(self) -> list[str]:
        _, newest = _glibc(self.glibc_version)
        names = []
        for minor in range(newest, 4, -1):
            names.append(f"manylinux_2_{minor}_{self.machine}")
            if minor in _LEGACY_MANYLINUX:
                names.append(f"{_LEGACY_MANYLINUX[minor]}_{self.machine}")
        return names

    def supported_tags(self) -> list[tags.Tag]:
        """Every wheel tag the node accepts, best first (as pip ranks them)."""
        if self.system == "Darwin":
            major, minor = _mac_version(self.mac_version)
            platforms = list(tags.mac_platforms((major, minor), self.machine))
        else:
            platforms = self.pip_platforms()
        version = tuple(int(part) for part in self.python_minor.split("."))
        return [
            *tags.cpython_tags(version, platforms=platforms),
            *tags.compatible_tags(version, self.cp_tag, platforms=platforms),
        ]

    def describe(self) -> str:
        where = f"macOS {self.mac_version}" if self.system == "Darwin" else self.system
        return f"Python {self.python_version} on {where} {self.machine}"


class UnsupportedPlatform(Exception):
    """No wheels can be chosen for this node."""


def _mac_version(version: str) -> tuple[int, int]:
    parts = [int(p) for p in version.split(".")[:2] if p.isdigit()] or [11]
    major = parts[0]
    # From macOS 11 on, wheels name the major version only (macosx_14_0).
    return (major, 0) if major >= 11 else (major, parts[1] if len(parts) > 1 else 0)


def _glibc(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def local_platform() -> NodePlatform:
    """This machine's platform (the orchestrator's interpreter)."""
    from packaging.markers import default_environment

    libc, libc_version = platform.libc_ver()
    return NodePlatform(
        python_version=platform.python_version(),
        implementation=sys.implementation.name,
        system=platform.system(),
        machine=platform.machine(),
        mac_version=platform.mac_ver()[0],
        glibc_version=libc_version if libc == "glibc" else "",
        marker_env={k: str(v) for k, v in default_environment().items()},
    )


def macos_platform(mac_version: str = "14.0", python_version: str | None = None) -> NodePlatform:
    """An Apple Silicon Mac as its probe would report it: for plans made without one."""
    version = python_version or platform.python_version()
    minor = ".".join(version.split(".")[:2])
    return NodePlatform(
        python_version=version,
        implementation="cpython",
        system="Darwin",
        machine="arm64",
        mac_version=mac_version,
        marker_env={
            "implementation_name": "cpython",
            "implementation_version": version,
            "os_name": "posix",
            "platform_machine": "arm64",
            "platform_release": "23.0.0",
            "platform_system": "Darwin",
            "platform_version": "Darwin Kernel Version 23.0.0",
            "python_full_version": version,
            "platform_python_implementation": "CPython",
            "python_version": minor,
            "sys_platform": "darwin",
        },
    )
