"""`pull` with the real huggingface_hub client against a local hub (testkit/hub_server.py)
serving the bundled model's mlx-lm files: into an empty cache, cut and resumed, refused
bytes, a gated repo, offline mode."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants, snapshot_download

from contract.settings import ModelSettings
from orchestrator.models.hub import ALLOW_PATTERNS, HubAccess, HubError
from orchestrator.models.location import node_path, pinned_commit, resolve_spec
from orchestrator.models.pull import PARTIAL, PullProgress, pull
from testkit.hub_server import TEST_REPO, HubServer, ServedRepo, serve_dir

WEIGHTS = "model.safetensors"



def _model(store: Path, spec: str = f"hf:{TEST_REPO}") -> ModelSettings:
    return ModelSettings(path=spec, store=str(store))


def _access(hub: HubServer, token: str | None = None, offline: bool = False) -> HubAccess:
    return HubAccess(hub.url, token, offline)


def _files_equal(snapshot: Path, source: Path) -> None:
    served = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    pulled = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    assert pulled == served
    for rel in served:
        assert (snapshot / rel).read_bytes() == (source / rel).read_bytes(), rel


def test_pull_into_empty_cache(tmp_path: Path, hub: HubServer, served: ServedRepo) -> None:
    """Every file arrives once, verified, in the HF cache layout that mlx-lm reads offline."""
    model = _model(tmp_path / "store")
    report = pull(model, PullProgress(), _access(hub))
    assert report.commit == served.commit
    assert (
        report.downloaded_bytes == report.total_bytes == sum(f.size for f in served.files.values())
    )
    snapshot = Path(report.path)
    repo_dir = tmp_path / "store" / f"models--{TEST_REPO.replace('/', '--')}"
    assert snapshot == repo_dir / "snapshots" / served.commit
    _files_equal(snapshot, served.files[WEIGHTS].source.parent)
    assert sum(hub.sent.values()) == report.total_bytes  # nothing fetched twice
    # huggingface_hub itself finds it offline (what mlx-lm's load does with a hub id)
    found = snapshot_download(
        TEST_REPO, cache_dir=tmp_path / "store", local_files_only=True,
        allow_patterns=ALLOW_PATTERNS,
    )
    assert Path(found) == snapshot
    assert pinned_commit(model) == served.commit

    again = pull(model, PullProgress(), _access(hub))
    assert again.downloaded_bytes == 0 and again.cached_bytes == again.total_bytes


def test_cut_pull_resumes(tmp_path: Path, hub: HubServer, served: ServedRepo) -> None:
    """A connection cut mid-file fails the pull (the hub then refuses), keeps the bytes that
    arrived, and the next pull asks only for the rest."""
    model = _model(tmp_path / "store")
    size = served.files[WEIGHTS].size
    hub.faults.cut_after[WEIGHTS] = size // 2
    hub.faults.refuse_after_cut = 10  # huggingface_hub retries within a run: make it give up
    with pytest.raises(HubError, match="pull again to resume"):
        pull(model, PullProgress(), _access(hub))
    blobs = tmp_path / "store" / f"models--{TEST_REPO.replace('/', '--')}" / "blobs"
    partial = blobs / (served.files[WEIGHTS].sha256 + PARTIAL)
    kept = partial.stat().st_size  # what huggingface_hub had written: whole 10 MiB chunks
    assert 0 < kept <= size // 2 and size // 2 - kept < constants.DOWNLOAD_CHUNK_SIZE
    hub.faults.refuse_after_cut = 0
    first = before = hub.sent[WEIGHTS]
    report = pull(model, PullProgress(), _access(hub))
    assert hub.sent[WEIGHTS] - before == size - kept  # only the rest was asked for
    assert (WEIGHTS, kept) in hub.ranges
    assert report.resumed_bytes == kept
    print(f"\ncut after {first} B: kept {kept} B, re-sent {first - kept} B of {size} B")
    _files_equal(Path(report.path), served.files[WEIGHTS].source.parent)


def test_corrupt_bytes_refused(tmp_path: Path, hub: HubServer, served: ServedRepo) -> None:
    """Bytes that do not hash to what the hub announced are refused and not kept."""
    hub.faults.corrupt.add(WEIGHTS)
    with pytest.raises(HubError, match="refused and removed") as caught:
        pull(_model(tmp_path / "store"), PullProgress(), _access(hub))
    assert WEIGHTS in str(caught.value)
    blobs = tmp_path / "store" / f"models--{TEST_REPO.replace('/', '--')}" / "blobs"
    assert not (blobs / served.files[WEIGHTS].sha256).exists()
    assert not (blobs / (served.files[WEIGHTS].sha256 + PARTIAL)).exists()


def test_gated_repo_says_how_to_log_in(tmp_path: Path, served: ServedRepo) -> None:
    """401 without a token and 403 with a wrong one name the repo and `hf auth login`;
    the right token pulls."""
    gated = ServedRepo(served.repo_id, served.commit, served.files, token="hf_right")
    with HubServer([gated]) as hub:
        for token, status in ((None, 401), ("hf_wrong", 403)):
            with pytest.raises(HubError) as caught:
                pull(_model(tmp_path / "store"), PullProgress(), _access(hub, token))
            message = str(caught.value)
            assert f"HTTP {status}" in message and TEST_REPO in message
            assert "hf auth login" in message and "HF_TOKEN" in message
        report = pull(_model(tmp_path / "store"), PullProgress(), _access(hub, "hf_right"))
        assert report.commit == served.commit


def test_unknown_repo_and_revision(tmp_path: Path, hub: HubServer) -> None:
    """A name or revision the hub lacks says which."""
    with pytest.raises(HubError, match="has no model mlx-community/nope"):
        pull(_model(tmp_path, "hf:mlx-community/nope"), PullProgress(), _access(hub))
    with pytest.raises(HubError, match="has no revision 'v9'"):
        pull(_model(tmp_path, f"hf:{TEST_REPO}@v9"), PullProgress(), _access(hub))


def test_offline_uses_cache_or_fails_clearly(tmp_path: Path, hub: HubServer) -> None:
    """HF_HUB_OFFLINE: an uncached model fails naming the cache and the fix; a cached one
    is found without a request."""
    model = _model(tmp_path / "store")
    with pytest.raises(HubError, match=r"HF_HUB_OFFLINE is set .* lacks"):
        pull(model, PullProgress(), _access(hub, offline=True))
    online = pull(model, PullProgress(), _access(hub))
    requests = len(hub.ranges)
    offline = pull(model, PullProgress(), _access(hub, offline=True))
    assert offline.path == online.path and offline.downloaded_bytes == 0
    assert len(hub.ranges) == requests


def test_no_space_fails_before_the_first_byte(
    tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Free disk below what is missing: nothing is fetched, the message says how much."""
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(
        shutil,
        "disk_usage",
        lambda p: real(p)._replace(free=1000),  # type: ignore[attr-defined]
    )
    with pytest.raises(HubError, match="free: nothing was downloaded"):
        pull(_model(tmp_path / "store"), PullProgress(), _access(hub))
    assert not hub.ranges


def test_resolve_spec_pins_the_pulled_commit(
    tmp_path: Path, hub: HubServer, served: ServedRepo
) -> None:
    """After a pull the cluster's model is the snapshot path (the same on every node),
    served under its NAME; before it, the error says to pull."""
    from orchestrator.config import ClusterSpec, NodeSpec
    from orchestrator.models.location import LocationError

    spec = ClusterSpec(nodes=[NodeSpec(name="a")], model=_model(tmp_path / "store"))
    with pytest.raises(LocationError, match="orchestrator pull"):
        resolve_spec(spec)
    pull(spec.model, PullProgress(), _access(hub))
    resolved = resolve_spec(spec)
    assert resolved.model.path == node_path(spec.model, served.commit)
    assert resolved.model.path.endswith(f"/snapshots/{served.commit}")
    assert resolved.model.served_id == "SmolLM2-135M-Instruct-test"


def test_code_files_pulled_only_when_trusted(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A repository's *.py is not fetched unless [model] trust_remote_code is set."""
    from testkit.remote_code_model import CODE_FILE, with_tokenizer_code

    source = with_tokenizer_code(tiny_model_dir, tmp_path / "repo", tmp_path / "ran")
    with HubServer([serve_dir(TEST_REPO, source)]) as hub:
        plain = pull(_model(tmp_path / "a"), PullProgress(), _access(hub))
        assert not (Path(plain.path) / CODE_FILE).exists()
        assert (Path(plain.path) / "tokenizer_config.json").is_file()
        trusted = ModelSettings(path=f"hf:{TEST_REPO}", store=str(tmp_path / "b"),
                                trust_remote_code=True)
        assert (Path(pull(trusted, PullProgress(), _access(hub)).path) / CODE_FILE).is_file()


def test_a_blob_id_that_is_no_hash_is_refused(tmp_path: Path, served: ServedRepo) -> None:
    """A hub (or mirror) announcing a file id like ../../x is refused before any write."""
    import dataclasses

    files = dict(served.files)
    files[WEIGHTS] = dataclasses.replace(files[WEIGHTS], sha256="../../../escaped")
    hostile = ServedRepo(served.repo_id, served.commit, files)
    with HubServer([hostile]) as hub, pytest.raises(HubError, match="no SHA-1 or SHA-256"):
        pull(_model(tmp_path / "store"), PullProgress(), _access(hub))
    assert not list(tmp_path.rglob("escaped*"))


def test_a_commit_id_that_is_no_hash_is_refused(tmp_path: Path, served: ServedRepo) -> None:
    """A hub answering a revision with a commit like ../../x is refused before any write
    (it would name snapshots/<commit>/)."""
    hostile = ServedRepo(served.repo_id, "../../escaped", dict(served.files))
    with HubServer([hostile]) as hub, pytest.raises(HubError, match="no git commit id"):
        pull(_model(tmp_path / "store"), PullProgress(), _access(hub))
    assert not list(tmp_path.rglob("escaped*"))


def test_a_present_blob_of_the_right_size_but_wrong_bytes_is_fetched_again(
    tmp_path: Path, hub: HubServer, served: ServedRepo
) -> None:
    """A blob already in the cache (another tool's download, a damaged disk) is checked by
    its hash, not its size: a damaged one is replaced; a sound one is not fetched again."""
    model = _model(tmp_path / "store")
    pull(model, PullProgress(), _access(hub))
    blob = (tmp_path / "store" / f"models--{TEST_REPO.replace('/', '--')}" / "blobs"
            / served.files[WEIGHTS].sha256)
    from node_agent.models.hashes import HashCache

    assert HashCache(blob.parent).get(blob.stat()) == blob.name  # kept: not read again
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.unlink()  # huggingface_hub's snapshot links point at it by name
    blob.write_bytes(bytes(data))
    before = hub.sent[WEIGHTS]
    report = pull(model, PullProgress(), _access(hub))
    assert hub.sent[WEIGHTS] - before == served.files[WEIGHTS].size
    assert report.downloaded_bytes == served.files[WEIGHTS].size
    assert blob.read_bytes() == served.files[WEIGHTS].source.read_bytes()
    again = pull(model, PullProgress(), _access(hub))
    assert again.downloaded_bytes == 0
