"""The digest of the code a node runs: the `contract`, `node_agent` and `serving` packages.

The orchestrator deploys them to `<cache>/code/<digest>/` and the agent reports
the digest of what it runs, so both sides compute it here, the same way.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DEPLOYED_PACKAGES = ("contract", "node_agent", "serving")
# Package data as declared in pyproject.toml, plus the code itself.
_SUFFIXES = (".py", ".json", ".toml", ".txt")
# Written last into a deployed copy; its presence marks a complete copy.
DIGEST_FILE = "CODE_DIGEST"


def code_root() -> Path:
    """The directory that holds this `node_agent` package (and `serving` next to it)."""
    return Path(__file__).resolve().parent.parent


def package_files(root: Path, packages: tuple[str, ...] = DEPLOYED_PACKAGES) -> list[str]:
    """Relative POSIX paths of the deployable files, sorted (the digest's order)."""
    found: list[str] = []
    for package in packages:
        base = root / package
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in _SUFFIXES:
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def code_digest(root: Path, files: list[str] | None = None) -> str:
    """sha256 over (path, size, content) of every deployable file; 16 hex chars."""
    h = hashlib.sha256()
    for rel in files if files is not None else package_files(root):
        data = (root / rel).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()[:16]
