"""Model references: the three forms from one parse, the hub's form checked, the cache
folder, where nodes hold it, the served name."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.model_ref import (
    Bundled,
    Directory,
    Hub,
    ModelRefError,
    parse_hub,
    parse_model_ref,
)
from contract.settings import ModelSettings
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
    ref = parse_hub(spec)
    assert (ref.repo_id, ref.revision) == (repo, revision)
    assert ref.folder == "models--" + repo.replace("/", "--")
    assert ref.spec == spec.removesuffix("@main")
    assert ref.pinned == (revision == SHA)


@pytest.mark.parametrize(
    "spec", ["hf:name", "hf:a/b/c", "hf:/name", "hf:org/", "hf:org/na me", "hf:o--x/n", "hf:o/n@"]
)
def test_malformed_forms_are_named(spec: str) -> None:
    """Each says what is wrong with it."""
    with pytest.raises(ModelRefError, match="hf:"):
        parse_model_ref(spec)


@pytest.mark.parametrize(
    "spec",
    ["hf:org/name@../../x", "hf:org/name@..", "hf:org/name@refs/../../x", "hf:org/name@a//b",
     "hf:org/name@/etc", "hf:org/name@main/", "hf:org/name@.hidden"],
)
def test_a_revision_that_is_no_safe_path_part_is_refused(spec: str) -> None:
    """The revision becomes refs/<revision> in the cache: '..', '.x' or empty parts never
    parse, with an error naming the revision."""
    revision = spec.partition("@")[2]
    with pytest.raises(ModelRefError, match=f"the revision '{revision}' is not a safe path"):
        parse_model_ref(spec)


@pytest.mark.parametrize(
    ("spec", "ref"),
    [
        ("bundled:smollm2-135m-instruct", Bundled("smollm2-135m-instruct")),
        ("hf:org/name@v1", Hub("org", "name", "v1")),
        ("/models/Qwen3-4bit/", Directory("/models/Qwen3-4bit/")),
        ("~/m", Directory("~/m")),
    ],
)
def test_each_form_parses_to_its_own_type(spec: str, ref: object) -> None:
    """bundled:, hf: and anything else (a directory) from one parse; spec round-trips."""
    assert parse_model_ref(spec) == ref
    assert parse_model_ref(spec).spec == spec


def test_parse_hub_refuses_the_other_forms() -> None:
    """Code that needs a hub model says so when given a directory."""
    with pytest.raises(ModelRefError, match="is not hf:ORG/NAME"):
        parse_hub("/models/x")


def test_nodes_path_and_served_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the home directory the path is written with ~ (each node expands its own);
    a store is used as written; clients call the model NAME."""
    monkeypatch.setenv("HF_HUB_CACHE", str(Path.home() / "hfc"))
    model = ModelSettings(path="hf:org/Name-4bit@v1")
    assert node_path(model, SHA) == f"~/hfc/models--org--Name-4bit/snapshots/{SHA}"
    stored = ModelSettings(path="hf:org/Name-4bit", store="/Volumes/m/")
    assert node_path(stored, SHA) == f"/Volumes/m/models--org--Name-4bit/snapshots/{SHA}"
    assert model.served_id == stored.served_id == "Name-4bit"
