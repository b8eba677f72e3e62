"""Parsers for macOS tools: `sw_vers`, `sysctl`, `vm_stat`, and MLX's Metal device info.

Formats (see tests/fixtures/README.md for where each recording comes from):

    $ sw_vers                         $ sysctl iogpu.wired_limit_mb
    ProductName:\t\tmacOS             iogpu.wired_limit_mb: 0
    ProductVersion:\t\t15.7.2         $ sysctl -n machdep.cpu.brand_string
    BuildVersion:\t\t24G325           Apple M3 Ultra
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# Runs in the node's Python (the ranks' own, with their mlx): Metal's recommended working
# set as MLX reads it (mlx/backend/metal/device_info.cpp). mx.device_info (MLX 0.30.4+)
# replaces mx.metal.device_info, which older MLX has; both print the same dict.
DEVICE_INFO_PROBE = (
    "import mlx.core as mx\n"
    "print(mx.device_info(mx.gpu) if hasattr(mx, 'device_info') else mx.metal.device_info())\n"
)
WORKING_SET_KEY = "max_recommended_working_set_size"


@dataclass(frozen=True)
class SwVers:
    product_name: str
    product_version: str
    build_version: str | None


def parse_sw_vers(text: str) -> SwVers:
    """`sw_vers` prints `Key:<tabs or spaces>Value` lines; older macOS said "Mac OS X"."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    if "ProductVersion" not in fields:
        raise ValueError(f"no ProductVersion in sw_vers output: {text[:200]!r}")
    return SwVers(
        product_name=fields.get("ProductName", "macOS"),
        product_version=fields["ProductVersion"],
        build_version=fields.get("BuildVersion"),
    )


def parse_sysctl_value(text: str, name: str | None = None) -> str:
    """The value of one sysctl, from `sysctl -n NAME` (bare) or `sysctl NAME` (`NAME: value`)."""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if name is not None and line.startswith(name + ":"):
            return line[len(name) + 1 :].strip()
        return line
    raise ValueError(f"no value for {name or 'sysctl'} in {text[:200]!r}")


def parse_sysctl_int(text: str, name: str | None = None) -> int:
    return int(parse_sysctl_value(text, name))


def parse_vm_stat_wired(text: str) -> int:
    """Bytes wired down, from `vm_stat`: its header gives the page size (16384 on Apple
    Silicon), then `Pages wired down:   400018.`"""
    page_size = wired = None
    for line in text.splitlines():
        if "page size of" in line:
            page_size = int(line.split("page size of")[1].split()[0])
        elif line.startswith("Pages wired down:"):
            wired = int(line.split(":")[1].strip().rstrip("."))
    if page_size is None or wired is None:
        raise ValueError(f"no page size or wired pages in vm_stat output: {text[:200]!r}")
    return wired * page_size


def parse_working_set_bytes(text: str) -> int:
    """Metal's recommendedMaxWorkingSetSize from the printed device info dict (the last line
    that is one; a deprecation warning or other output may come before it):

        {'device_name': 'Apple M5 Max', 'max_recommended_working_set_size': 115448725504, ...}
    """
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            info = ast.literal_eval(line)  # a dict of str and int literals, never code
            value = info.get(WORKING_SET_KEY) if isinstance(info, dict) else None
            if isinstance(value, int) and value > 0:
                return value
            raise ValueError(f"no positive {WORKING_SET_KEY} in {line[:200]!r}")
    raise ValueError(f"no device info dict in {text[:200]!r}")
