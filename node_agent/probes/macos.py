"""Parsers for macOS tools: `sw_vers` and `sysctl`.

Formats (see tests/fixtures/README.md for where each recording comes from):

    $ sw_vers                         $ sysctl iogpu.wired_limit_mb
    ProductName:\t\tmacOS             iogpu.wired_limit_mb: 0
    ProductVersion:\t\t15.7.2         $ sysctl -n machdep.cpu.brand_string
    BuildVersion:\t\t24G325           Apple M3 Ultra
"""

from __future__ import annotations

from dataclasses import dataclass


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
