"""The head's TLS listener: an agent fetches the head's files with the certificate pinned;
another certificate, a wrong token or a file not served is refused; the address a node
reaches the head at is its cable's when the head is on the ring."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from contract.model_manifest import FetchFile, ModelFetch, ModelFinalize, ModelPrepare
from node_agent.models import relay, store
from node_agent.models.hashes import CACHE_ENV, build_manifest
from node_agent.models.store import StoreError
from orchestrator.config.load import check_cluster_data
from orchestrator.provision.sync.head_serve import HeadServer, head_address
from testkit.model_dirs import big_model


@pytest.fixture(autouse=True)
def private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "hash-cache"))


async def fetch_all(
    head: HeadServer,
    target: Path,
    *,
    cert: str = "",
    token: str = "",
    files: list[str] | None = None,
) -> int:
    manifest, _ = build_manifest(head.root)
    head.files = frozenset(files if files is not None else [f.path for f in manifest.files])
    prepared = store.prepare(ModelPrepare(path=str(target), manifest=manifest))
    sizes = {f.path: f.size for f in manifest.files}
    fetch = ModelFetch(
        staging=prepared.staging,
        host="127.0.0.1",
        port=await head.port("127.0.0.1"),
        token=token or head.token,
        files=[FetchFile(path=f.path, offset=f.offset, size=sizes[f.path]) for f in prepared.send],
        timeout_s=5.0,
        tls_cert=cert or head.cert_pem,
    )
    try:
        return (await relay.fetch(fetch)).received_bytes
    finally:
        await head.close()


def test_a_node_fetches_the_heads_files_over_tls_and_they_verify(tmp_path: Path) -> None:
    """Every byte arrives through the pinned TLS listener; finalize checks them all."""
    source = big_model(tmp_path / "head")
    manifest, _ = build_manifest(source)
    target = tmp_path / "node" / "model"
    got = asyncio.run(fetch_all(HeadServer(source), target))
    assert got == manifest.total_bytes
    store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert build_manifest(target)[0].digest() == manifest.digest()


def test_another_certificate_a_wrong_token_or_an_unserved_file_is_refused(
    tmp_path: Path,
) -> None:
    """Only the certificate of this sync is trusted, only its token and files served."""
    source = big_model(tmp_path / "head")
    impostor = HeadServer(source).cert_pem
    with pytest.raises(StoreError, match=r"cannot reach the head at 127\.0\.0\.1.*certificate"):
        asyncio.run(fetch_all(HeadServer(source), tmp_path / "a" / "m", cert=impostor))
    with pytest.raises(StoreError, match=r"refused .*wrong token"):
        asyncio.run(fetch_all(HeadServer(source), tmp_path / "b" / "m", token="0" * 64))
    with pytest.raises(StoreError, match=r"refused .*not served"):
        asyncio.run(fetch_all(HeadServer(source), tmp_path / "c" / "m", files=["config.json"]))


def test_the_head_on_the_ring_is_reached_over_its_cable() -> None:
    """A node cabled to a local node fetches at the local node's end of that cable; without
    a cable, at the address this machine's route to its SSH host starts from."""
    nodes = [
        {"name": "head", "transport": "local", "ip": "10.9.0.1"},
        {"name": "b", "transport": "ssh", "ssh": "me@127.0.0.1", "ip": "10.9.0.2"},
        {"name": "c", "transport": "ssh", "ssh": "me@127.0.0.1", "ip": "10.9.2.2"},
    ]
    links = [
        {"between": ["b", "head"], "ips": ["10.9.0.2", "10.9.0.1"]},
        {"between": ["b", "c"], "ips": ["10.9.1.1", "10.9.1.2"]},
        {"between": ["c", "head"], "ips": ["10.9.2.2", "10.9.2.1"]},
    ]
    ring = check_cluster_data(
        {"model": {"path": "/m"}, "cluster": {"backend": "ring"}, "nodes": nodes, "links": links},
        Path("test.toml"),
    )[0]
    assert [head_address(ring, n) for n in ring.nodes[1:]] == ["10.9.0.1", "10.9.2.1"]
    lan = check_cluster_data({"model": {"path": "/m"}, "nodes": nodes}, Path("test.toml"))[0]
    assert head_address(lan, lan.nodes[1]) == "127.0.0.1"
