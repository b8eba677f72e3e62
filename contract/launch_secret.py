"""The per-launch secret that rank 0's internal API requires: the header and the file.

The orchestrator draws a new secret for every launch and sends it to rank 0 only as a
file in the rank's directory (mode 0600, written by the agent from its `spawn`), never
on a command line or in the environment. Rank 0 refuses every `/v1` request that does
not carry it in HEADER (401), so only the gateway, which adds it, reaches the model.
"""

from __future__ import annotations

import hmac
from pathlib import Path

HEADER = "X-Launch-Secret"
FILE = "launch_secret"  # in rank 0's working directory
TLS_KEY_FILE = "api_tls_key.pem"  # rank 0's TLS key and certificate, when it serves TLS
TLS_CERT_FILE = "api_tls_cert.pem"


class LaunchSecretError(ValueError):
    """The secret file is missing, unreadable or empty."""


def read_secret_file(path: Path) -> str:
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise LaunchSecretError(f"cannot read the launch secret file {path}: {exc}") from exc
    if not secret:
        raise LaunchSecretError(f"the launch secret file {path} is empty")
    return secret


def secret_matches(given: str | None, expected: str) -> bool:
    """Constant-time: the time taken tells nothing about how much of the secret matched."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())
