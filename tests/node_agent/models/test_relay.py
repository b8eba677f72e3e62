"""Forwarding between agents: a holder serves its files over TCP to a token, a receiver
fetches them into staging (resuming a partial file), and finalize checks every byte."""

from __future__ import annotations

import asyncio
import secrets
import socket
from pathlib import Path

import pytest

from contract.model_manifest import (
    MODEL_MISMATCH,
    FetchFile,
    Manifest,
    ModelFetch,
    ModelFetched,
    ModelFinalize,
    ModelPrepare,
    ModelServe,
)
from node_agent.models import relay, store
from node_agent.models.hashes import CACHE_ENV, build_manifest, sha256_file
from testkit.model_dirs import big_model


@pytest.fixture(autouse=True)
def private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "hash-cache"))


async def forward(holder: Path, target: Path, manifest: Manifest, token: str = "") -> int:
    return (await fetched(holder, target, manifest, token)).received_bytes


async def fetched(holder: Path, target: Path, manifest: Manifest, token: str = "") -> ModelFetched:
    prepared = store.prepare(ModelPrepare(path=str(target), manifest=manifest))
    sizes = {f.path: f.size for f in manifest.files}
    files = [FetchFile(path=f.path, offset=f.offset, size=sizes[f.path]) for f in prepared.send]
    real = secrets.token_hex(32)
    serving = await relay.handle(
        ModelServe(path=str(holder), host="127.0.0.1", token=real, files=list(sizes))
    )
    try:
        fetch = ModelFetch(
            staging=prepared.staging,
            host="127.0.0.1",
            port=serving.port,  # type: ignore[union-attr]
            token=token or real,
            files=files,
            timeout_s=5.0,
        )
        reply = await relay.handle(fetch)
        assert isinstance(reply, ModelFetched)
        return reply
    finally:
        await relay.handle(ModelServe(token=real, close=True))


def test_a_fetched_copy_is_verified_and_renamed(tmp_path: Path) -> None:
    holder = big_model(tmp_path / "holder")
    manifest, _ = build_manifest(holder)
    target = tmp_path / "node" / "model"
    got = asyncio.run(forward(holder, target, manifest))
    assert got == manifest.total_bytes
    store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert all(
        (target / f.path).read_bytes() == (holder / f.path).read_bytes() for f in manifest.files
    )
    assert not relay._serving  # the listener is closed


def test_each_file_is_hashed_as_it_arrives_and_never_read_again(tmp_path: Path) -> None:
    """The fetch answers each file's SHA-256, hashed while its bytes were written, and
    leaves it in the node's hash cache: finalize checks the manifest without a read."""
    holder = big_model(tmp_path / "holder")
    manifest, _ = build_manifest(holder)
    target = tmp_path / "node" / "model"
    reply = asyncio.run(fetched(holder, target, manifest))
    assert reply.sha256 == [f.sha256 for f in manifest.files]
    done = store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert done.hashed_bytes == 0


def test_a_wrong_byte_on_the_way_gives_its_true_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One byte changed between the socket and the disk's hash (as a fault on the wire
    past TCP's checksum would): the hash answered is that of the bytes written, so the
    file differs from the manifest at once, and finalize refuses it from the cache."""
    holder = big_model(tmp_path / "holder")
    manifest, _ = build_manifest(holder)
    real_recv_into = socket.socket.recv_into
    flipped = False

    def recv_into(sock: socket.socket, buffer: memoryview, *args: int) -> int:
        nonlocal flipped
        n = real_recv_into(sock, buffer, *args)
        if n > 1000 and not flipped:
            buffer[500] ^= 0x01
            flipped = True
        return n

    monkeypatch.setattr(socket.socket, "recv_into", recv_into)
    target = tmp_path / "node" / "model"
    reply = asyncio.run(fetched(holder, target, manifest))
    assert flipped
    staging = store.staging_path(target)
    written = [sha256_file(staging / f.path) for f in manifest.files]
    assert reply.sha256 == written  # what is on the disk, not what was sent
    wrong = [f.path for f, sha in zip(manifest.files, reply.sha256, strict=True) if sha != f.sha256]
    assert len(wrong) == 1
    with pytest.raises(store.StoreError) as caught:
        store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert caught.value.code == MODEL_MISMATCH and wrong[0] in caught.value.message


def test_a_partial_file_resumes_where_it_stopped(tmp_path: Path) -> None:
    holder = big_model(tmp_path / "holder")
    manifest, _ = build_manifest(holder)
    target = tmp_path / "node" / "model"
    staging = store.staging_path(target)
    staging.mkdir(parents=True)
    pad = (holder / "pad.safetensors").read_bytes()
    (staging / "pad.safetensors").write_bytes(pad[:600_000])
    reply = asyncio.run(fetched(holder, target, manifest))
    assert reply.received_bytes == manifest.total_bytes - 600_000
    assert reply.sha256 == [f.sha256 for f in manifest.files]  # the staged prefix's too
    done = store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert done.hashed_bytes == 0


def test_a_corrupt_byte_at_the_holder_is_caught_at_the_next_hop(tmp_path: Path) -> None:
    holder = big_model(tmp_path / "holder")
    manifest, _ = build_manifest(holder)
    pad = bytearray((holder / "pad.safetensors").read_bytes())
    pad[1000] ^= 0xFF  # bit rot after the holder's own check
    (holder / "pad.safetensors").write_bytes(pad)
    target = tmp_path / "node" / "model"
    asyncio.run(forward(holder, target, manifest))
    with pytest.raises(store.StoreError) as caught:
        store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert caught.value.code == MODEL_MISMATCH and "pad.safetensors" in caught.value.message
    assert not target.exists()


def test_a_wrong_token_is_refused(tmp_path: Path) -> None:
    holder = big_model(tmp_path / "holder")
    manifest, _ = build_manifest(holder)
    with pytest.raises(store.StoreError, match="wrong token"):
        asyncio.run(forward(holder, tmp_path / "node" / "model", manifest, token="x" * 64))


def test_a_listener_left_open_closes_when_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An orchestrator that never sent close=True does not leave the port open for good."""
    holder = big_model(tmp_path / "holder")
    monkeypatch.setattr(relay, "IDLE_CLOSE_S", 0.2)

    async def left_open() -> bool:
        token = secrets.token_hex(32)
        await relay.handle(ModelServe(path=str(holder), host="127.0.0.1", token=token))
        assert token in relay._serving
        await asyncio.sleep(1.0)
        return token in relay._serving

    assert not asyncio.run(left_open())


def test_a_holder_not_yet_receiving_may_serve_what_it_will_hold(tmp_path: Path) -> None:
    """With sync_forwarding, a node may be asked to serve before its own copy has begun
    (hops overlap): it listens at once; without staging, a missing model is refused."""
    later = tmp_path / "later" / "model"

    async def serve_then_hold() -> int:
        token = secrets.token_hex(32)
        request = ModelServe(path=str(later), host="127.0.0.1", token=token, staging=True)
        serving = await relay.handle(request)
        await relay.handle(ModelServe(token=token, close=True))
        return serving.port  # type: ignore[union-attr]

    assert asyncio.run(serve_then_hold()) > 0
    with pytest.raises(store.StoreError, match="nothing to serve"):
        asyncio.run(relay.handle(
            ModelServe(path=str(later), host="127.0.0.1", token=secrets.token_hex(32))))
