"""The node's side of a model sync: hash cache, staging, resume offsets, verify, rename."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contract.model_manifest import (
    MODEL_MISMATCH,
    NOT_OURS,
    FileRange,
    ManifestFile,
    ModelFinalize,
    ModelPrefixHash,
    ModelPrepare,
)
from node_agent.models import store
from node_agent.models.hashes import CACHE_ENV, HashCache, build_manifest, sha256_file
from testkit import paths
from testkit.model_dirs import big_model


@pytest.fixture(autouse=True)
def private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "hash-cache"))


def test_a_second_manifest_reads_nothing(tmp_path: Path) -> None:
    """The second manifest of an unchanged directory comes from the cache: 0 bytes hashed."""
    model = big_model(tmp_path / "m")
    first, stats = build_manifest(model)
    assert stats.hashed_bytes == first.total_bytes > 1 << 20
    (model / ".DS_Store").write_bytes(b"finder")  # hidden files are not the model's
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "x.metadata").write_text("downloaded at ...")
    again, stats = build_manifest(model)
    assert again == first and stats.hashed_bytes == 0
    assert first.by_path()["pad.safetensors"].sha256 == sha256_file(model / "pad.safetensors")


def test_hash_caches_of_one_model_open_at_once_keep_each_others_entries(
    tmp_path: Path,
) -> None:
    """An agent's requests run in threads, each with its own cache of the model: a save
    merges into the file, so the last one does not drop what the others put."""
    model = big_model(tmp_path / "m")
    first, second = HashCache(model), HashCache(model)
    a, b = model / "pad.safetensors", model / "config.json"
    first.put(a.stat(), "a" * 64, a)
    second.put(b.stat(), "b" * 64, b)
    first.save()
    second.save()
    again = HashCache(model)
    assert again.get(a.stat()) == "a" * 64 and again.get(b.stat()) == "b" * 64
    b.unlink()  # a removed file's entry goes at the next save
    first.put(a.stat(), "c" * 64, a)
    first.save()
    assert HashCache(model).get(a.stat()) == "c" * 64
    assert len(json.loads(first.file.read_text())) == 1


def test_prepare_stage_finalize_renames_a_verified_copy(tmp_path: Path) -> None:
    """A missing copy: every file to send; once staged, finalize verifies and renames."""
    source = big_model(tmp_path / "src")
    manifest, _ = build_manifest(source)
    target = tmp_path / "node" / "model"
    prepared = store.prepare(ModelPrepare(path=str(target), manifest=manifest))
    assert not prepared.current and not target.exists()
    assert sorted(f.path for f in prepared.send) == sorted(f.path for f in manifest.files)
    for f in prepared.send:
        shutil.copyfile(source / f.path, Path(prepared.staging) / f.path)
    done = store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert done.files == len(manifest.files)
    assert not Path(prepared.staging).exists()
    again = store.prepare(ModelPrepare(path=str(target), manifest=manifest))
    assert again.current and again.hashed_bytes == 0  # the cache followed the rename
    assert build_manifest(target)[1].hashed_bytes == 0  # and the fingerprint uses it


def _send_all(source: Path, staging: Path, manifest_files: list[str]) -> None:
    for rel in manifest_files:
        shutil.copyfile(source / rel, staging / rel)


def test_sync_replaces_its_own_copy_and_refuses_a_foreign_directory(tmp_path: Path) -> None:
    """A directory sync did not make (another model's files) is refused, naming the path
    and the fix, and left intact; the copy sync made carries its marker and is replaced
    by the next sync of another version."""
    source = big_model(tmp_path / "src")
    manifest, _ = build_manifest(source)
    foreign = tmp_path / "models"
    (foreign / "other-model").mkdir(parents=True)
    (foreign / "other-model" / "weights.safetensors").write_bytes(b"precious")
    for attempt in (store.prepare, store.finalize):
        with pytest.raises(store.StoreError) as caught:
            if attempt is store.finalize:  # staged by hand: finalize checks again
                store.staging_path(foreign).mkdir()
                _send_all(source, store.staging_path(foreign), [f.path for f in manifest.files])
                store.finalize(ModelFinalize(path=str(foreign), manifest=manifest))
            else:
                store.prepare(ModelPrepare(path=str(foreign), manifest=manifest))
        assert caught.value.code == NOT_OURS
        assert f"{foreign} is a directory that sync did not make" in str(caught.value)
        assert "Fix: set [model] path" in str(caught.value)
        assert (foreign / "other-model" / "weights.safetensors").read_bytes() == b"precious"
    ours = tmp_path / "ours"
    prepared = store.prepare(ModelPrepare(path=str(ours), manifest=manifest))
    _send_all(source, Path(prepared.staging), [f.path for f in prepared.send])
    store.finalize(ModelFinalize(path=str(ours), manifest=manifest))
    assert (ours / store.SYNC_MARKER).is_file()
    (source / "config.json").write_text('{"model_type": "llama", "changed": true}')
    changed, _ = build_manifest(source)
    prepared = store.prepare(ModelPrepare(path=str(ours), manifest=changed))
    _send_all(source, Path(prepared.staging), [f.path for f in prepared.send])
    store.finalize(ModelFinalize(path=str(ours), manifest=changed))
    assert "changed" in (ours / "config.json").read_text()


def test_one_changed_file_is_the_only_one_sent(tmp_path: Path) -> None:
    """The right files of a differing copy are linked into staging, not sent again."""
    source = big_model(tmp_path / "src")
    manifest, _ = build_manifest(source)
    target = tmp_path / "model"
    shutil.copytree(source, target)
    (target / store.SYNC_MARKER).write_text("")  # a copy an earlier sync made
    with (target / "pad.safetensors").open("r+b") as f:
        f.seek(1000)
        f.write(b"\xff")
    prepared = store.prepare(ModelPrepare(path=str(target), manifest=manifest))
    assert [f.path for f in prepared.send] == ["pad.safetensors"]
    assert prepared.reused_bytes == manifest.total_bytes - (1 << 20)


def test_a_partial_file_resumes_before_its_last_window(tmp_path: Path) -> None:
    """A half-sent file resumes at its size minus the window, with that prefix's hash."""
    source = big_model(tmp_path / "src")
    manifest, _ = build_manifest(source)
    target = tmp_path / "model"
    store.prepare(ModelPrepare(path=str(target), manifest=manifest))
    staged = store.staging_path(target) / "pad.safetensors"
    staged.write_bytes((source / "pad.safetensors").read_bytes()[:700_000])
    prepared = store.prepare(
        ModelPrepare(path=str(target), manifest=manifest, resume_window=200_000)
    )
    pad = next(f for f in prepared.send if f.path == "pad.safetensors")
    assert pad.offset == 500_000 and staged.stat().st_size == 500_000
    ask = ModelPrefixHash(
        path=str(source), ranges=[FileRange(path="pad.safetensors", length=500_000)]
    )
    assert store.prefix_hashes(ask).sha256 == [pad.prefix_sha256]


def test_a_corrupt_staged_file_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    """finalize refuses a staged file whose hash differs, removes it, leaves the path alone."""
    source = big_model(tmp_path / "src")
    manifest, _ = build_manifest(source)
    target = tmp_path / "model"
    prepared = store.prepare(ModelPrepare(path=str(target), manifest=manifest))
    for f in prepared.send:
        shutil.copyfile(source / f.path, Path(prepared.staging) / f.path)
    bad = Path(prepared.staging) / "config.json"
    bad.write_text(bad.read_text().replace("llama", "llamb"))
    with pytest.raises(store.StoreError) as caught:
        store.finalize(ModelFinalize(path=str(target), manifest=manifest))
    assert caught.value.code == MODEL_MISMATCH and "config.json" in caught.value.message
    assert not target.exists() and not bad.exists()


def test_paths_outside_the_model_are_refused(tmp_path: Path) -> None:
    """A manifest naming ../ is refused before anything is touched."""
    manifest = build_manifest(big_model(tmp_path / "src"))[0]
    evil = type(manifest)(files=[ManifestFile(path="../x", size=1, sha256="0" * 64)])
    with pytest.raises(store.StoreError):
        store.prepare(ModelPrepare(path=str(tmp_path / "t"), manifest=evil))
    assert not (tmp_path / "t.partial-sync").exists()


def test_a_second_sync_of_the_same_path_is_refused_while_one_runs(tmp_path: Path) -> None:
    """Another agent mid-sync (holding the path's lock) makes prepare refuse, naming it."""
    source = big_model(tmp_path / "src")
    target = tmp_path / "model"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from contract.model_manifest import ModelPrepare\n"
        "from node_agent.models import store\n"
        "from node_agent.models.hashes import build_manifest\n"
        f"manifest = build_manifest(Path({str(source)!r}))[0]\n"
        f"store.prepare(ModelPrepare(path={str(target)!r}, manifest=manifest))\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    root = paths.ROOT
    holder = subprocess.Popen(
        [sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        manifest, _ = build_manifest(source)
        with pytest.raises(store.StoreError) as caught:
            store.prepare(ModelPrepare(path=str(target), manifest=manifest))
        assert caught.value.code == store.SYNC_BUSY and str(target) in caught.value.message
    finally:
        holder.kill()
        holder.wait()
    assert not store.prepare(ModelPrepare(path=str(target), manifest=manifest)).current
