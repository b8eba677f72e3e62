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
