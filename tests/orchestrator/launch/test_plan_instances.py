"""`plan --offline` of a file with `[[instances]]`: every instance's ranks, ports and
env, and the memory of a node they share summed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from testkit.config_files import TWO_INSTANCES_SHARING_B, write

TWO = """
[cluster]
name = "home"
rank_port = 52100
[serving]
rank_api_port = 52200
""" + TWO_INSTANCES_SHARING_B


def test_every_instance_is_planned_on_its_nodes_and_ports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """main on a, b (ring ports 52100-1); fast on b (rank 0's API 52201, its own id)."""
    assert main(["plan", str(write(tmp_path, TWO)), "--offline", "--json"]) == 0
    out, err = capsys.readouterr()
    plans = {plan["instance"]: plan for plan in json.loads(out)["instances"]}
    assert list(plans) == ["main", "fast"]
    assert [r["node"] for r in plans["main"]["ranks"]] == ["a", "b"]
    assert [r["node"] for r in plans["fast"]["ranks"]] == ["b"]
    settings = [json.loads(r["files"]["settings.json"]) for r in plans["fast"]["ranks"]]
    assert settings[0]["serving"]["rank_api_port"] == 52201
    assert settings[0]["model"]["id"] == "small"
    hostfile = plans["main"]["ranks"][0]["files"]["hostfile.json"]
    assert ":52100" in hostfile and ":52101" in hostfile, hostfile
    assert "home-fast" in plans["fast"]["ranks"][0]["cwd"]
    assert "instance main: " in err and "instance fast: " in err, err


def test_a_shared_node_too_small_for_both_is_refused_with_the_sum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each instance fits b alone; together they do not: exit 2, both named."""
    config = str(write(tmp_path, TWO))
    assert main(["plan", config, "--offline", "--memory-gb", "b=0.3"]) == 2
    err = capsys.readouterr().err
    assert "[memory] b: the instances sharing it need main" in err and "+ fast" in err, err
