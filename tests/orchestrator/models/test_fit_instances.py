"""`models --fit cluster.toml` with `[[instances]]`: each instance on its own nodes, and a
shared node too small for both refused with the sum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from testkit.config_files import TWO_INSTANCES_SHARING_B, write

TWO = TWO_INSTANCES_SHARING_B


def test_each_instance_fits_on_its_own_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """main in pipeline over a and b, fast in one rank on b; no shared node refused."""
    assert main(["models", "--fit", str(write(tmp_path, TWO)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {row["instance"]: row for row in data["instances"]}
    assert rows["main"]["nodes"] == ["a", "b"] and rows["main"]["fit"]["mode"] == "pipeline"
    assert rows["fast"]["nodes"] == ["b"] and len(rows["fast"]["fit"]["weight_bytes"]) == 1
    assert data["shared_nodes_refused"] == []


def test_a_shared_node_too_small_for_both_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """b fits each instance alone, not both: exit 1 and the sum named."""
    assert main(["models", "--fit", str(write(tmp_path, TWO)), "--memory-gb", "b=0.3"]) == 1
    captured = capsys.readouterr()
    assert "fast" in captured.out and "[memory] b: the instances sharing it need" in captured.err


def test_the_catalog_names_which_instance_serves_what_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`models cluster.toml --json`: each instance with its model, id and nodes."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert main(["models", str(write(tmp_path, TWO)), "--json"]) == 0
    served = json.loads(capsys.readouterr().out)["instances"]
    assert [(s["instance"], s["id"], s["nodes"]) for s in served] == [
        ("main", "smollm2-135m-instruct", ["a", "b"]), ("fast", "small", ["b"])]
