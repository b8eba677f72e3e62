"""Parsers for Linux system files: /etc/os-release and /proc/cpuinfo."""

from __future__ import annotations

import shlex


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines, values optionally shell-quoted (parsed, never executed)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        try:
            parts = shlex.split(raw)
        except ValueError:
            parts = [raw.strip("\"'")]
        fields[key.strip()] = parts[0] if parts else ""
    return fields


def parse_cpuinfo_model(text: str) -> str | None:
    """The first `model name` (x86) or `Model`/`Hardware` (arm boards) line of /proc/cpuinfo."""
    fallback: str | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and value.strip():
            return value.strip()
        if key in ("model", "hardware") and value.strip() and fallback is None:
            fallback = value.strip()
    return fallback
