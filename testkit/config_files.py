"""cluster.toml texts written for a test, and the issues validation finds in one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.config import ClusterSpec, ConfigErrors, ConfigIssue, check_cluster_file
from orchestrator.config.load import check_cluster_data


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(text))
    return path


def errors_of(tmp_path: Path, text: str) -> list[ConfigIssue]:
    with pytest.raises(ConfigErrors) as caught:
        check_cluster_file(write(tmp_path, text))
    return caught.value.issues


def memory_cluster(memory_gb: list[float | None], transport: str = "ssh",
                   **sections: object) -> ClusterSpec:
    """A cluster of len(memory_gb) nodes n0, n1...: memory_gb where given (None: unset)."""
    nodes = [
        {"name": f"n{i}", "ip": f"10.0.0.{i + 1}", "transport": transport}
        | ({"ssh": f"me@10.0.0.{i + 1}", "python": "python3"} if transport == "ssh" else {})
        | ({"memory_gb": gb} if gb is not None else {})
        for i, gb in enumerate(memory_gb)
    ]
    spec, _warnings = check_cluster_data({"nodes": nodes, **sections}, Path("test.toml"))
    return spec


# Two instances of the bundled model on two ssh nodes of 8 GB: "main" over a and b, "fast"
# (id "small") on b alone, so b carries ranks of both (plan, fit and catalog tests).
TWO_INSTANCES_SHARING_B = """
[[nodes]]
name = "a"
ip = "10.0.0.1"
transport = "ssh"
ssh = "a"
memory_gb = 8
[[nodes]]
name = "b"
ip = "10.0.0.2"
transport = "ssh"
ssh = "b"
memory_gb = 8
[[instances]]
name = "main"
model = "bundled:smollm2-135m-instruct"
nodes = ["a", "b"]
[[instances]]
name = "fast"
model = "bundled:smollm2-135m-instruct"
id = "small"
nodes = ["b"]
"""
