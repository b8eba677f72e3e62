"""`pull` with `[[instances]]`: each distinct hf: model once, named by its instances; then
`sync`/`up` locate each instance's model at its pinned snapshot, served under its NAME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import check_cluster_file
from orchestrator.config.instances import instance_specs
from orchestrator.models.commands import located
from testkit.config_files import write
from testkit.hub_server import HubServer, serve_dir
from testkit.model_configs import SMOLLM2

FILE = """
[[nodes]]
name = "a"
ip = "127.0.0.1"
[[nodes]]
name = "b"
ip = "127.0.0.1"
[[instances]]
name = "big-a"
model = "hf:org/big"
nodes = ["a"]
[[instances]]
name = "big-b"
model = "hf:org/big"
nodes = ["b"]
[[instances]]
name = "local"
model = "bundled:smollm2-135m-instruct"
id = "small"
nodes = ["a"]
"""


def test_each_hub_model_is_pulled_once_and_located_per_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replicas of org/big: one pull naming both; each replica then at its snapshot."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(SMOLLM2))
    (repo / "model.safetensors").write_bytes(b"\0" * 1000)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", "")
    config = write(tmp_path, FILE)
    with HubServer([serve_dir("org/big", repo)]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert main(["pull", str(config), "--json"]) == 0
    (pulled,) = json.loads(capsys.readouterr().out)
    assert pulled["model"] == "hf:org/big" and pulled["instances"] == ["big-a", "big-b"]
    assert hub.sent["model.safetensors"] == 1000  # once, not once per replica
    spec = located(check_cluster_file(config)[0], config, pull_first=False)
    derived = instance_specs(spec)
    assert derived["big-a"].model.path == derived["big-b"].model.path == pulled["node_path"]
    assert derived["big-a"].model.served_id == "big"
    assert derived["local"].model.path == "bundled:smollm2-135m-instruct"
