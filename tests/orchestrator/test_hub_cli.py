"""`orchestrator pull`, `models` and `plan` with an hf: model, as commands, against the
local hub (HF_ENDPOINT), and the catalog's view of a cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from orchestrator.models.hub import ALLOW_PATTERNS
from testkit.hub_server import HubServer, ServedRepo, serve_dir
from tests.model_fixtures import bundled_quantized_dir  # noqa: F401

REPO = "mlx-community/SmolLM2-135M-Instruct-test"


@pytest.fixture(scope="module")
def served(bundled_quantized_dir: Path) -> ServedRepo:  # noqa: F811
    return serve_dir(REPO, bundled_quantized_dir)


@pytest.fixture
def hub(served: ServedRepo) -> Iterator[HubServer]:
    with HubServer([served]) as server:
        yield server


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cluster(tmp_path: Path, store: Path | None = None) -> Path:
    config = tmp_path / "cluster.toml"
    extra = f'store = "{store}"\n' if store else ""
    config.write_text(f'[[nodes]]\nname = "a"\n[model]\npath = "hf:{REPO}"\n{extra}')
    return config


def test_allow_patterns_are_mlx_lms() -> None:
    """We fetch exactly what mlx-lm's own download fetches."""
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    assert sorted(ALLOW_PATTERNS) == sorted(DEFAULT_ALLOW_PATTERNS)


def test_pull_models_plan_commands(tmp_path: Path, hub: HubServer, served: ServedRepo) -> None:
    """Before the pull: `plan` says to pull, `models` shows the hub's size; `pull --json`
    fetches it; then `models` describes it and `plan` launches ranks on the snapshot
    path, offline."""
    config = _cluster(tmp_path)
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_TOKEN": ""}
    total = sum(f.size for f in served.files.values())

    before = _run(["plan", str(config)], env)
    assert before.returncode == 2 and f"orchestrator pull {config}" in before.stderr
    listed = json.loads(_run(["models", str(config), "--json"], env).stdout)
    assert [(m["name"], m["where"], m["size_bytes"]) for m in listed] == [(REPO, "hub", total)]

    pulled = _run(["pull", str(config), "--json"], env)
    assert pulled.returncode == 0, pulled.stderr
    report = json.loads(pulled.stdout)
    assert report["commit"] == served.commit and report["downloaded_bytes"] == total
    assert report["node_path"].endswith(f"/snapshots/{served.commit}")

    (model,) = json.loads(_run(["models", str(config), "--json"], env).stdout)
    assert (model["where"], model["commit"], model["refs"]) == ("cache", served.commit, "main")
    assert (model["architecture"], model["layers"], model["heads"], model["kv_heads"]) == (
        "llama", 30, 9, 3
    )
    assert model["quantization"] == "4-bit g32" and model["size_bytes"] == total

    plan = tomllib.loads(_run(["plan", str(config)], env).stdout)
    (rank,) = plan["ranks"]
    assert rank["env"]["HF_HUB_OFFLINE"] == "1"
    settings = json.loads(rank["files"]["settings.json"])
    assert settings["model"]["path"] == report["node_path"]
    assert settings["model"]["id"] == "SmolLM2-135M-Instruct-test"


def test_pull_of_a_directory_model_says_what_to_use(tmp_path: Path) -> None:
    """`pull` is for hf: models; a directory's config says to use sync."""
    config = tmp_path / "cluster.toml"
    config.write_text('[[nodes]]\nname = "a"\n[model]\npath = "/models/x"\n')
    result = _run(["pull", str(config)], {})
    assert result.returncode == 2 and "orchestrator sync" in result.stderr


def test_pull_into_a_store_shows_progress_and_where_nodes_hold_it(
    tmp_path: Path, hub: HubServer
) -> None:
    """With [model] store the files land there, and the summary names the nodes' path."""
    store = tmp_path / "store"
    result = _run(["pull", str(_cluster(tmp_path, store))], {"HF_ENDPOINT": hub.url})
    assert result.returncode == 0, result.stderr
    assert f"the nodes hold it at {store}/models--" in result.stdout
    assert (store / f"models--{REPO.replace('/', '--')}" / "refs" / "main").is_file()
