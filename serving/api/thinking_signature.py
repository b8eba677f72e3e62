"""Signatures of thinking blocks: made with the cluster's key, checked when a client sends
the thinking back in a later turn (a forged or edited one is a 400).

A signature is `v1.<mac>` (HMAC-SHA256 of the thinking text, base64url), or
`v1.<mac>.<text>` when the answer left the text out (`thinking.display: "omitted"`): the
signature then carries the text (base64url), so a client that sends the block back gives
the model its reasoning again, as Anthropic's encrypted signatures do. The text is signed,
not hidden: it is the client's own answer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from pathlib import Path

from contract import thinking_key

log = logging.getLogger(__name__)
VERSION = "v1"
_DOMAIN = b"mlx-cluster-orchestrator thinking v1\0"


class BadSignature(ValueError):
    """The signature was not made here, or not for this text."""


def load_key(directory: Path) -> bytes:
    """The cluster's key from rank 0's working directory; a key of this process's own if
    the orchestrator gave none (a rank started by hand: signatures last until it stops)."""
    try:
        key = (directory / thinking_key.FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        key = ""
    if not key:
        log.warning("no %s file: thinking signatures last only as long as this process",
                    thinking_key.FILE)
        return secrets.token_bytes(32)
    return key.encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, text: str) -> bytes:
    return hmac.new(key, _DOMAIN + text.encode(), hashlib.sha256).digest()


def sign(key: bytes, text: str, carry_text: bool = False) -> str:
    parts = [VERSION, _b64(_mac(key, text))]
    if carry_text:
        parts.append(_b64(text.encode()))
    return ".".join(parts)


def verify(key: bytes, signature: str, shown: str) -> str:
    """The thinking text the signature vouches for (`shown`, or the text it carries when
    `shown` is empty); BadSignature if this cluster did not sign it."""
    parts = signature.split(".")
    if len(parts) not in (2, 3) or parts[0] != VERSION:
        raise BadSignature("not a signature made by this server")
    try:
        mac = _unb64(parts[1])
        carried = _unb64(parts[2]).decode() if len(parts) == 3 else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadSignature("not a signature made by this server") from exc
    text = carried if carried is not None and not shown else shown
    if not hmac.compare_digest(mac, _mac(key, text)):
        raise BadSignature("the signature does not match this thinking (edited, or made "
                           "by another cluster)")
    return text
