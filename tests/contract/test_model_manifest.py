"""contract/model_manifest.py: a model directory's manifest, its digest, its paths."""

from __future__ import annotations

import pytest

from contract.agent_protocol import decode_agent_message, decode_request, encode
from contract.model_manifest import (
    FileToSend,
    Manifest,
    ManifestFile,
    ModelPrepare,
    ModelPrepared,
    safe_relative,
)

A = ManifestFile(path="config.json", size=10, sha256="a" * 64)
B = ManifestFile(path="model.safetensors", size=1000, sha256="b" * 64)


def test_digest_is_of_the_content_not_the_order() -> None:
    """Two listings of the same files in another order have one digest."""
    assert Manifest(files=[A, B]).digest() == Manifest(files=[B, A]).digest()
    assert len(Manifest(files=[A, B]).digest()) == 64


@pytest.mark.parametrize(
    "changed",
    [
        ManifestFile(path="model2.safetensors", size=1000, sha256="b" * 64),
        ManifestFile(path="model.safetensors", size=1001, sha256="b" * 64),
        ManifestFile(path="model.safetensors", size=1000, sha256="c" * 64),
    ],
)
def test_any_changed_name_size_or_hash_changes_the_digest(changed: ManifestFile) -> None:
    """A renamed, resized or changed file gives another digest."""
    assert Manifest(files=[A, changed]).digest() != Manifest(files=[A, B]).digest()


def test_a_missing_or_extra_file_changes_the_digest() -> None:
    """A file more or less gives another digest."""
    assert Manifest(files=[A]).digest() != Manifest(files=[A, B]).digest()
    assert Manifest(files=[]).digest() != Manifest(files=[A]).digest()


def test_totals_and_lookup() -> None:
    """Total bytes and lookup by path."""
    manifest = Manifest(files=[A, B])
    assert manifest.total_bytes == 1010
    assert manifest.by_path() == {"config.json": A, "model.safetensors": B}


@pytest.mark.parametrize(
    ("path", "safe"),
    [
        ("config.json", True),
        ("sub/dir/weights.safetensors", True),
        ("", False),
        ("/etc/passwd", False),
        ("../outside", False),
        ("a/../../b", False),
        ("a//b", False),
        ("./a", False),
        ("a/", False),
    ],
)
def test_a_manifest_path_stays_inside_its_directory(path: str, safe: bool) -> None:
    """No absolute path, `..`, `.` or empty part can leave the model directory."""
    assert safe_relative(path) is safe


def test_sync_messages_are_members_of_the_protocols_unions() -> None:
    """The agent decodes ModelPrepare as a request; the orchestrator decodes its reply."""
    request = ModelPrepare(id=3, path="~/m", manifest=Manifest(files=[A, B]), resume_window=64)
    assert decode_request(encode(request)) == request
    reply = ModelPrepared(
        id=3,
        path="/Users/me/m",
        current=False,
        staging="/Users/me/m.partial-sync",
        send=[FileToSend(path=B.path, offset=512, prefix_sha256="d" * 64)],
    )
    assert decode_agent_message(encode(reply)) == reply
