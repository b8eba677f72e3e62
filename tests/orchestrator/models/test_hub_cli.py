"""`orchestrator pull`, `models` and `plan` with an hf: model, as commands, against the
local hub (HF_ENDPOINT), and the catalog's view of a cache."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from orchestrator.models.hub import ALLOW_PATTERNS
from testkit.hub_server import TEST_REPO, HubServer, ServedRepo

# They start no rank, sshd, namespace, browser or Prometheus; the ones that run the CLI as a
# child process (against a local hub) take seconds each, so they leave the fast lane (e2e);
# the pure check stays in it.
SLOW = pytest.mark.e2e




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
    config.write_text(f'[[nodes]]\nname = "a"\n[model]\npath = "hf:{TEST_REPO}"\n{extra}')
    return config


def test_allow_patterns_are_mlx_lms() -> None:
    """We fetch exactly what mlx-lm's own download fetches."""
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    assert sorted(ALLOW_PATTERNS) == sorted(DEFAULT_ALLOW_PATTERNS)


@SLOW
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
    assert [(m["name"], m["where"], m["size_bytes"]) for m in listed] == [(TEST_REPO, "hub", total)]

    pulled = _run(["pull", str(config), "--json"], env)
    assert pulled.returncode == 0, pulled.stderr
    report = json.loads(pulled.stdout)
    assert report["commit"] == served.commit and report["downloaded_bytes"] == total
    assert report["node_path"].endswith(f"/snapshots/{served.commit}")

    (model,) = json.loads(_run(["models", str(config), "--json"], env).stdout)
    assert (model["where"], model["commit"], model["refs"]) == ("cache", served.commit, "main")
    assert (model["architecture"], model["layers"], model["heads"], model["kv_heads"]) == (
        "llama",
        30,
        9,
        3,
    )
    assert model["quantization"] == "4-bit g32" and model["size_bytes"] == total

    plan = tomllib.loads(_run(["plan", str(config)], env).stdout)
    (rank,) = plan["ranks"]
    assert rank["env"]["HF_HUB_OFFLINE"] == "1"
    settings = json.loads(rank["files"]["settings.json"])
    assert settings["model"]["path"] == report["node_path"]
    assert settings["model"]["id"] == "SmolLM2-135M-Instruct-test"


@SLOW
def test_pull_of_a_directory_model_says_what_to_use(tmp_path: Path) -> None:
    """`pull` is for hf: models; a directory's config says to use sync."""
    config = tmp_path / "cluster.toml"
    config.write_text('[[nodes]]\nname = "a"\n[model]\npath = "/models/x"\n')
    result = _run(["pull", str(config)], {})
    assert result.returncode == 2 and "orchestrator sync" in result.stderr


@SLOW
def test_pull_into_a_store_shows_progress_and_where_nodes_hold_it(
    tmp_path: Path, hub: HubServer
) -> None:
    """With [model] store the files land there, and the summary names the nodes' path."""
    store = tmp_path / "store"
    result = _run(["pull", str(_cluster(tmp_path, store))], {"HF_ENDPOINT": hub.url})
    assert result.returncode == 0, result.stderr
    assert f"the nodes hold it at {store}/models--" in result.stdout
    assert (store / f"models--{TEST_REPO.replace('/', '--')}" / "refs" / "main").is_file()


@SLOW
def test_ctrl_c_keeps_what_arrived_and_the_next_pull_resumes(
    tmp_path: Path, hub: HubServer, served: ServedRepo
) -> None:
    """SIGINT mid-pull: exit 130 naming the command that resumes; the next pull asks the
    hub only for the bytes not kept."""
    weights = served.files["model.safetensors"]
    hub.faults.rate = 20e6  # ~5 s for the weights: time to interrupt
    config = _cluster(tmp_path)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    child = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "pull", str(config), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while hub.sent[weights.path] < 25e6 and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert f"`orchestrator pull {config}` resumes" in err
    blobs = tmp_path / "cache" / f"models--{TEST_REPO.replace('/', '--')}" / "blobs"
    kept = (blobs / f"{weights.sha256}.partial").stat().st_size
    assert kept > 0
    hub.faults.rate = None
    before = hub.sent[weights.path]
    resumed = _run(
        ["pull", str(config), "--json"],
        {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_ENDPOINT": hub.url},
    )
    assert resumed.returncode == 0, resumed.stderr
    assert hub.sent[weights.path] - before == weights.size - kept
    assert json.loads(resumed.stdout)["resumed_bytes"] == kept
