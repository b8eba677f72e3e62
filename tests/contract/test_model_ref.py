"""The hf: form: parsing, the cache folder, where nodes hold it, the served name."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.settings import ModelSettings
from contract.model_ref import hub_problem, parse
from orchestrator.models.location import node_path

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("spec", "repo", "revision"),
    [
        ("hf:mlx-community/Qwen3-30B-A3B-4bit", "mlx-community/Qwen3-30B-A3B-4bit", "main"),
        ("hf:org/name@v1.2", "org/name", "v1.2"),
        (f"hf:org/name@{SHA}", "org/name", SHA),
        ("hf:org/name@refs/pr/3", "org/name", "refs/pr/3"),
    ],
)
def test_valid_forms(spec: str, repo: str, revision: str) -> None:
    """ORG/NAME with an optional branch, tag, PR ref or commit."""
    assert hub_problem(spec) is None
    ref = parse(spec)
    assert (ref.repo_id, ref.revision) == (repo, revision)
    assert ref.folder == "models--" + repo.replace("/", "--")


@pytest.mark.parametrize(
    "spec", ["hf:name", "hf:a/b/c", "hf:/name", "hf:org/", "hf:org/na me", "hf:o--x/n", "hf:o/n@"]
)
def test_malformed_forms_are_named(spec: str) -> None:
    """Each says what is wrong with it."""
    assert hub_problem(spec)


def test_nodes_path_and_served_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the home directory the path is written with ~ (each node expands its own);
    a store is used as written; clients call the model NAME."""
    monkeypatch.setenv("HF_HUB_CACHE", str(Path.home() / "hfc"))
    model = ModelSettings(path="hf:org/Name-4bit@v1")
    assert node_path(model, SHA) == f"~/hfc/models--org--Name-4bit/snapshots/{SHA}"
    stored = ModelSettings(path="hf:org/Name-4bit", store="/Volumes/m/")
    assert node_path(stored, SHA) == f"/Volumes/m/models--org--Name-4bit/snapshots/{SHA}"
    assert model.served_id == stored.served_id == "Name-4bit"
