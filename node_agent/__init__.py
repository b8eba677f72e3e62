"""node_agent: the small program the orchestrator runs on every node.

It speaks typed JSON lines on stdin/stdout (`contract/agent_protocol.py`), spawns and
watches rank processes, relays their output and reports the node's fingerprint.
Only the standard library, msgspec and (optionally) psutil may be imported here.
"""

AGENT_VERSION = "0.1.0"
