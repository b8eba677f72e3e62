"""`up` with [model] sync of an hf: model (orchestrator/models/commands.py `located`):
pulls when the model was never pulled; once pulled, serves the pulled commit without
asking the hub (an offline boot serves; `pull` is what updates it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_cluster
from orchestrator.models.commands import located
from testkit.hub_server import TEST_REPO, HubServer, ServedRepo
from testkit.orchestrator_process import write_cluster
from testkit.ports import free_port


@pytest.mark.e2e  # a pull of the bundled model from the local hub: seconds
def test_a_pulled_model_is_served_without_the_hub(
    tmp_path: Path, served: ServedRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First `up`: pulled from the hub. With the hub gone: the same pinned directory, no
    error, no request."""
    model = {"path": f"hf:{TEST_REPO}", "store": str(tmp_path / "store"), "sync": True}
    spec = load_cluster(write_cluster(tmp_path, model["path"], [{"name": "a"}], model=model))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "unused-cache"))
    with HubServer([served]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        first = located(spec, tmp_path / "cluster.toml", pull_first=True)
        assert sum(hub.sent.values()) == sum(f.size for f in served.files.values())
    assert first.model.path.endswith(f"/snapshots/{served.commit}")
    # no hub at all (a port nobody listens on): asking it would fail with "cannot reach"
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    again = located(spec, tmp_path / "cluster.toml", pull_first=True)
    assert again.model.path == first.model.path
