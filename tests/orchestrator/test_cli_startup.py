"""What `orchestrator up` (and every CLI command) imports before it meets a node: no SSH
stack for local nodes, no Hugging Face client for a model on disk, no X.509 library for
a launch on loopback."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.config import NodeSpec
from orchestrator.transports import LocalTransport, transport_for
from testkit.paths import ROOT

PROBE = """
import json, sys
import orchestrator.cli, orchestrator.up, orchestrator.status.control
import orchestrator.models.commands  # `up` imports it before it connects
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                        ("asyncssh", "huggingface_hub", "cryptography"))))
"""


def test_the_cli_and_up_import_no_ssh_hub_or_x509_library() -> None:
    """Importing the CLI, `up` and the status commands loads none of asyncssh,
    huggingface_hub, cryptography (0.6 s of CPU of each start)."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    assert json.loads(out) == []


def test_transport_for_still_picks_ssh_or_local() -> None:
    """An ssh node gets the (lazily imported) SshTransport, a local one LocalTransport."""
    from orchestrator.transports import SshTransport

    ssh = transport_for(NodeSpec(name="b", transport="ssh", ssh="user@b"))
    assert type(ssh) is SshTransport
    assert type(transport_for(NodeSpec(name="a"))) is LocalTransport
