"""Overlapping forwarding hops: a node fetches a file once its predecessor holds it
verified; the agent serves it from staging, then from the copy it was renamed to."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from contract.model_manifest import FetchFile, ModelFetch, ModelServe
from node_agent.models import relay
from orchestrator.provision.sync.forward import _Held


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
