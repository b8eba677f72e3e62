"""Overlapping forwarding hops: a node fetches a file once its predecessor holds it
verified; the agent serves it from staging, then from the copy it was renamed to; and
with real agents a hop's first file reaches the next node before the last reaches it."""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import sys
from pathlib import Path

import pytest

from contract.model_manifest import FetchFile, ModelFetch, ModelServe
from node_agent.models import relay
from orchestrator.provision.sync.forward import _Held
from testkit.orchestrator_process import write_cluster
from testkit.sync_runs import NO_STANDBY, by_node, same_files, sync


def test_a_wait_ends_when_the_file_is_verified_or_the_holder_failed() -> None:
    """wait(path) is True once marked, False when the holder failed first; wait() is the
    whole copy in place."""

    async def run() -> list[bool]:
        held = _Held(["a", "b"])
        waiting = asyncio.ensure_future(held.wait("a"))
        await asyncio.sleep(0)
        assert not waiting.done()
        held.mark("a")
        first = await waiting
        whole = asyncio.ensure_future(held.wait())
        held.gone.set()
        return [first, await held.wait("b"), await whole]

    assert asyncio.run(run()) == [True, False, False]


def test_a_holder_serves_from_staging_then_from_its_renamed_copy(tmp_path: Path) -> None:
    """With staging=True a file still in <path>.partial-sync is served, and after the
    rename into <path> the same listener serves it from there."""
    model = tmp_path / "holder" / "model"
    staging = tmp_path / "holder" / "model.partial-sync"
    staging.mkdir(parents=True)
    (staging / "w.bin").write_bytes(b"x" * 1000)
    receiver = tmp_path / "recv"
    receiver.mkdir()

    async def run() -> list[bytes]:
        token = secrets.token_hex(32)
        serve = ModelServe(path=str(model), host="127.0.0.1", token=token, files=["w.bin"],
                           staging=True)
        serving = await relay.handle(serve)
        got = []
        try:
            for _ in range(2):
                fetch = ModelFetch(staging=str(receiver), host="127.0.0.1",
                                   port=serving.port,  # type: ignore[union-attr]
                                   token=token, files=[FetchFile(path="w.bin", offset=0,
                                                                 size=1000)], timeout_s=5.0)
                await relay.handle(fetch)
                got.append((receiver / "w.bin").read_bytes())
                (receiver / "w.bin").unlink()
                if staging.exists():
                    staging.rename(model)
        finally:
            await relay.handle(ModelServe(token=token, close=True))
        return got

    assert asyncio.run(run()) == [b"x" * 1000, b"x" * 1000]
    assert model.is_dir() and not staging.exists()


def home_node(tmp_path: Path, name: str) -> dict[str, object]:
    """A local node whose agent has its own $HOME, so `~/models/m` is its own disk."""
    home = tmp_path / name
    home.mkdir()
    python = tmp_path / f"python-{name}"
    python.write_text(f'#!/bin/sh\nHOME={shlex.quote(str(home))} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return {"name": name, "python": str(python), "ip": "127.0.0.1"}


@pytest.mark.e2e
@pytest.mark.alone
def test_a_node_forwards_a_file_while_later_files_still_arrive_at_it(tmp_path: Path) -> None:
    """`sync --from h0` with forwarding: h2 fetches a.bin from h1 and holds it before the
    last, large file has finished arriving at h1 (the files' mtimes on each node's disk:
    when their last byte was written), instead of waiting for h1's whole copy."""
    source = tmp_path / "h0" / "models" / "m"
    nodes = [home_node(tmp_path, name) for name in ("h0", "h1", "h2")]
    source.mkdir(parents=True)
    (source / "a.bin").write_bytes(os.urandom(1 << 16))
    (source / "z.bin").write_bytes(os.urandom(48 << 20))  # arrives last, long after a.bin
    config = write_cluster(tmp_path, "~/models/m", nodes, model={"sync_forwarding": True},
                           **NO_STANDBY)
    code, report = sync(config, "--from", "h0")
    nodes_out = by_node(report)
    assert code == 0 and nodes_out["h2"]["forwarded_from"] == "h1", report
    h1, h2 = (tmp_path / name / "models" / "m" for name in ("h1", "h2"))
    assert same_files(h1, source) and same_files(h2, source)
    forwarded, last_arrived = (h2 / "a.bin").stat().st_mtime_ns, (h1 / "z.bin").stat().st_mtime_ns
    assert forwarded < last_arrived, (
        f"h2 held a.bin {(forwarded - last_arrived) / 1e6:.1f} ms after z.bin reached h1")
