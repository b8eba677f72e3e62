"""Namespace hosts shared by the tests of one module (a module-scoped fixture's body):
`netns_hosts` builds hosts for one test; tests that need the same hosts, each leaving
them as it found them, share one set instead (each set costs its namespaces, veths and
one sshd per host to build and tear down)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from testkit import require
from testkit.netns import MultiHost, TmpfsSpec, Topology, multi_host, usable
from testkit.require import missing


@contextlib.contextmanager
def shared_hosts(
    factory: pytest.TempPathFactory, count: int, topology: Topology, tmpfs: TmpfsSpec = None
) -> Iterator[MultiHost]:
    """`count` hosts joined as `topology`, removed on exit; skipped as `netns_hosts` skips
    (unless ORCHESTRATOR_TESTS_REQUIRE_NETNS=1)."""
    reason = usable()
    if reason is not None:
        missing(reason, require.NETNS)
    with multi_host(count, topology, factory.mktemp("hosts"), tmpfs) as net:
        yield net
