"""The base of every agent-protocol message (a msgspec tagged union on `type`).

Apart from agent_protocol so that message families in other contract modules
(model_manifest's sync messages) share it without an import cycle.
"""

from __future__ import annotations

from msgspec import Struct


class Message(Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of every wire message."""
