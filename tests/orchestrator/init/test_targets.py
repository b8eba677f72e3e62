"""init's HOST arguments: user, host and SSH port; the port lands in ssh_port."""

from __future__ import annotations

import pytest

from orchestrator.init.targets import Target, TargetError, parse_target
from testkit.orchestrator_process import run_cli


@pytest.mark.parametrize(("text", "expected"), [
    ("local", Target("local")),
    ("studio-a.local", Target("studio-a.local")),
    ("me@studio-a.local:2222", Target("me@studio-a.local", 2222)),
    ("10.1.0.11:22", Target("10.1.0.11")),
    ("me@[fe80::1%en0]:2200", Target("me@[fe80::1%en0]", 2200)),
    ("me@[::1]", Target("me@[::1]")),
    ("me@::1", Target("me@::1")),
])
def test_targets_split_into_ssh_and_port(text: str, expected: Target) -> None:
    """The port after the host (or after ']'), 22 without one; bare IPv6 takes none."""
    assert parse_target(text) == expected


@pytest.mark.parametrize("text", ["me@host:0", "me@host:65536", "me@host:ssh", "me@",
                                  "me@[::1", "me@[::1]x", "host:"])
def test_bad_targets_are_refused(text: str) -> None:
    """A port out of range or not a number, no host, an unclosed bracket."""
    with pytest.raises(TargetError):
        parse_target(text)


def test_a_bad_port_exits_2_naming_it() -> None:
    """The command line: exit 2 with the argument, before connecting anywhere."""
    done = run_cli("init", "local", "me@studio-b.local:99999")
    assert done.returncode == 2 and "'me@studio-b.local:99999'" in done.stderr
