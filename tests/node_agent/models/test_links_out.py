"""A sync source's symlinks that lead out of the model directory are refused, naming the
file (sync would copy their target, e.g. a private key, to every node); links inside it
and an HF cache snapshot's links into its blobs/ stay fine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from node_agent.models.hashes import ModelFileError, build_manifest
from testkit.orchestrator_process import run_cli, write_cluster


def _model(tmp_path: Path, tiny_model_dir: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    return model


def test_a_link_out_of_the_model_is_refused_naming_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    """build_manifest(contained=True) names the link and its target; a probe (not a sync
    source) still reads the directory."""
    model = _model(tmp_path, tiny_model_dir)
    secret = tmp_path / "id_ed25519"
    secret.write_text("PRIVATE KEY")
    (model / "notes.txt").symlink_to(secret)
    with pytest.raises(ModelFileError, match=r"notes\.txt leads to .*id_ed25519, outside"):
        build_manifest(model, contained=True)
    assert any(f.path == "notes.txt" for f in build_manifest(model)[0].files)


def test_links_inside_and_hf_blob_links_are_fine(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A link to a file of the model, and the HF cache's snapshots/<c>/f -> ../../blobs/<id>."""
    model = _model(tmp_path, tiny_model_dir)
    (model / "alias.json").symlink_to("config.json")
    build_manifest(model, contained=True)
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    for f in model.iterdir():
        if f.is_file() and not f.is_symlink():
            shutil.copy(f, repo / "blobs" / f.name)
            (snapshot / f.name).symlink_to(Path("../../blobs") / f.name)
    assert build_manifest(snapshot, contained=True)[0].files


@pytest.mark.e2e  # the CLI as a child process: seconds
def test_sync_refuses_before_connecting(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`orchestrator sync` of a source holding a link out exits 2 naming the file."""
    model = _model(tmp_path, tiny_model_dir)
    (model / "extra.txt").symlink_to("/etc/passwd")
    config = write_cluster(tmp_path, str(model), [{"name": "a", "ip": "127.0.0.1"}])
    done = run_cli("sync", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "extra.txt leads to /etc/passwd" in done.stderr and "Traceback" not in done.stderr
