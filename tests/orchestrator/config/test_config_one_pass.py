"""cluster.toml's errors in one pass: type errors and cross-field rules together, and MLX's
`null` pasted into rdma explained."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import ConfigErrors, check_cluster_file

TYPE_AND_RULE_ERRORS = """
[api]
port = "eighty"
api_key_env = "not a name"
[supervisor]
backoff_initial_s = 100.0
backoff_max_s = 10.0
[[nodes]]
name = "a"
ip = "10.0.0.1"
bogus = 1
[[nodes]]
name = "a"
ip = 5
"""


def errors(tmp_path: Path, text: str) -> list[tuple[str, str]]:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(ConfigErrors) as caught:
        check_cluster_file(path)
    return [(issue.path, issue.message) for issue in caught.value.issues]


def test_type_errors_and_cross_field_rules_in_one_report(tmp_path: Path) -> None:
    """Wrong types, an unknown key and three cross-field rules, all in one run; a rule is not
    re-reported about a value that was itself wrong (nodes[1].ip)."""
    found = errors(tmp_path, TYPE_AND_RULE_ERRORS)
    assert [path for path, _ in found] == [
        "nodes[0].bogus",
        "nodes[1].ip",
        "api.port",
        "nodes[1].name",
        "api.api_key_env",
        "supervisor.backoff_initial_s",
    ]


def test_a_missing_required_value_stops_only_the_rules(tmp_path: Path) -> None:
    """Without a node's name there is no spec to check rules on: the type errors remain."""
    found = errors(tmp_path, '[api]\nport = "x"\n[[nodes]]\nip = "10.0.0.1"\n')
    assert [path for path, _ in found] == ["nodes[0].name", "api.port"]


def test_mlx_null_in_rdma_says_write_empty_string(tmp_path: Path) -> None:
    """Pasting MLX's hostfile `null` gives TOML's syntax error plus the fix."""
    path = tmp_path / "cluster.toml"
    path.write_text('[cluster]\nbackend = "jaccl"\n[[nodes]]\nname = "a"\nrdma = [null, "x"]\n')
    with pytest.raises(ConfigErrors) as caught:
        check_cluster_file(path)
    (issue,) = caught.value.issues
    assert "line 5" in issue.message
    assert "write \"\" for the node's own index" in issue.fix
