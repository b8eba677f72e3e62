"""`orchestrator plan --offline` and `up --dry-run --offline`: the plan from the config
alone. Every shipped example plans without any SSH (a transport that fails if used), a node
whose memory nothing gives stops it naming node and field, and an hf: model not pulled is
read from the hub's config.json and listing only (the test hub counts the bytes)."""

from __future__ import annotations

import contextlib
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.config.load import check_cluster_data
from orchestrator.models.location import node_path
from orchestrator.transports import pool
from testkit.docs_toml import cluster_blocks
from testkit.hub_server import HubServer, serve_dir
from testkit.model_configs import SMOLLM2
from testkit.paths import ROOT

BLOCKS = cluster_blocks()
EXAMPLES = [ROOT / "cluster.toml.example", *sorted((ROOT / "docs" / "examples").glob("*.toml"))]


@pytest.fixture(autouse=True)
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any SSH connection or node pool fails the test: offline connects to nothing."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("plan --offline opened a connection to a node")

    monkeypatch.setattr(pool.NodePool, "__init__", refuse)
    monkeypatch.setattr("asyncssh.connect", refuse)


def _stand_ins(config: dict[str, Any]) -> list[str]:
    """--memory-gb for every ssh node without memory_gb (what a reader would pass)."""
    return [arg for node in config.get("nodes", [])
            if node.get("transport") == "ssh" and "memory_gb" not in node
            for arg in ("--memory-gb", f"{node['name']}=64")]


def _plan(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_shipped_example_plans_offline(example: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Each example file: exit 0, one rank per node (per instance's node) with its env,
    nothing connected; an instance's hf: model read from a test hub's config.json."""
    config = tomllib.loads(example.read_text())
    args = ["plan", "--offline", str(example), *_stand_ins(config)]
    with _hub_of(config.get("instances", []), tmp_path, monkeypatch):
        code, out, err = _plan(args, capsys)
    assert code == 0, err
    plan = tomllib.loads(out)
    plans = [(i["nodes"], p) for i, p in zip(config.get("instances", []),
                                              plan.get("instances", []), strict=True)]
    for nodes, one in plans or [([n["name"] for n in config["nodes"]], plan)]:
        assert [rank["node"] for rank in one["ranks"]] == nodes
        assert all("MLX_LAUNCH_ID" in rank["env"] for rank in one["ranks"])
    assert "offline: no node was connected to" in err
    if config.get("model", {}).get("path", "bundled:").startswith("bundled:") and not plans:
        assert plan["placement"]["ranks"], err  # readable here: the placement is decided


@contextlib.contextmanager
def _hub_of(instances: list[dict[str, Any]], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test hub serving each instance's hf: repo as a small model (no network here)."""
    repos = sorted({i["model"].removeprefix("hf:").partition("@")[0] for i in instances
                    if i["model"].startswith("hf:")})
    if not repos:
        yield
        return
    root = tmp_path / "repo"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(SMOLLM2))
    (root / "model.safetensors").write_bytes(b"\0" * 1000)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", "")
    with HubServer([serve_dir(repo, root) for repo in repos]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_every_cluster_file_in_the_docs_plans_offline(
    where: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' ```toml blocks, as a reader copies them: `up --dry-run --offline` too."""
    config = tomllib.loads(text)
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    args = ["up", "--dry-run", "--offline", str(path), *_stand_ins(config)]
    code, out, err = _plan(args, capsys)
    assert code == 0, f"{where}: {err}"
    assert len(tomllib.loads(out)["ranks"]) == len(config["nodes"])


def _cluster(tmp_path: Path, model: str, nodes: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(f'[model]\npath = "{model}"\n' + nodes)
    return path


SSH_NODES = """
[[nodes]]
name = "a"
transport = "ssh"
ssh = "me@a.invalid"
ip = "10.0.0.1"
python = "python3"
memory_gb = 2
[[nodes]]
name = "b"
transport = "ssh"
ssh = "me@b.invalid"
ip = "10.0.0.2"
python = "python3"
"""


def test_a_node_without_memory_stops_the_plan_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """b has no memory_gb: exit 2 naming nodes[1].memory_gb and the fix; --memory-gb b=1
    gives it, and the pipeline weighs the split by 2 : 1."""
    path = _cluster(tmp_path, "bundled:smollm2-135m-instruct", SSH_NODES)
    code, out, err = _plan(["plan", "--offline", str(path)], capsys)
    assert code == 2 and out == ""
    assert "nodes[1].memory_gb: node 'b' sets no memory_gb" in err
    assert "--memory-gb b=GB" in err
    code, out, err = _plan(["plan", "--offline", "--json", str(path), "--memory-gb", "b=1"],
                           capsys)
    assert code == 0, err
    shares = json.loads(out)["placement"]["ranks"]
    assert [s["budget_bytes"] for s in shares] == [2 * 1024**3, 1024**3]
    assert shares[0]["layers"][1] - shares[0]["layers"][0] == 20  # 2 : 1 of 30 layers
    assert "b: memory 1 GiB from --memory-gb" in err


def test_memory_for_a_node_not_in_the_cluster_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --memory-gb's node name: exit 2 listing the cluster's nodes."""
    path = _cluster(tmp_path, "bundled:smollm2-135m-instruct", SSH_NODES)
    code, _out, err = _plan(["plan", "--offline", str(path), "--memory-gb", "c=4"], capsys)
    assert code == 2 and "--memory-gb names c, not a node of this cluster (its nodes: a, b)" in err


def test_an_unpulled_hub_model_is_planned_from_its_config_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """hf: not pulled: placement from the hub's config.json; the ranks get the snapshot path
    the pull will make; the hub sent no weight byte and the cache is not marked pulled."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(SMOLLM2))
    (repo / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    served = serve_dir("org/tiny", repo)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", "")
    path = _cluster(tmp_path, "hf:org/tiny", SSH_NODES)
    with HubServer([served]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        args = ["plan", "--offline", "--json", str(path), "--memory-gb", "b=1"]
        code, out, err = _plan(args, capsys)
    assert code == 0, err
    assert hub.sent["config.json"] > 0 and hub.sent["model.safetensors"] == 0, hub.sent
    plan = json.loads(out)
    assert plan["placement"]["mode"] == "pipeline"
    settings = json.loads(plan["ranks"][0]["files"]["settings.json"])
    spec, _ = check_cluster_data(tomllib.loads(path.read_text()), path)
    assert settings["model"]["path"] == node_path(spec.model, served.commit)
    assert settings["model"]["id"] == "tiny"
    assert "(not pulled; no weight downloaded)" in err
    assert not (tmp_path / "cache" / "models--org--tiny").exists()  # no HF cache entry


def test_up_refuses_offline_without_dry_run(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`up --offline` alone would serve nothing: exit 2 saying to add --dry-run."""
    path = _cluster(tmp_path, "bundled:smollm2-135m-instruct", SSH_NODES)
    code, _out, err = _plan(["up", "--offline", str(path)], capsys)
    assert code == 2 and "add --dry-run" in err
