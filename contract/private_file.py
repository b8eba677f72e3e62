"""Writing a file that may hold a secret: atomically, with its mode from the first byte, and
never through a link someone left in the directory.

The bytes go to a fresh temporary file of a random name in the same directory, created with
O_EXCL|O_NOFOLLOW (an existing file or link at that name is an error, never opened), then
renamed over the target: a symlink at the target's name is replaced, its target untouched.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """`path` holds `data` with `mode` (the umask does not widen or narrow it)."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(temp, flags, mode & 0o600)  # owner-only until the bytes are in
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)  # os.open's mode is filtered by the umask
        temp.replace(path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
