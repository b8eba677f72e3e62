"""`[[instances]]`: parsing, the derived per-instance specs, their ports, and conflicts."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import check_cluster_file
from orchestrator.config.instances import instance_specs
from testkit.config_files import errors_of, write

NODES = """
[cluster]
name = "home"
rank_port = 52100
[serving]
rank_api_port = 52200
max_batch_size = 4
[[nodes]]
name = "a"
ip = "127.0.0.1"
[[nodes]]
name = "b"
ip = "127.0.0.1"
"""

TWO = NODES + """
[[instances]]
name = "main"
model = "bundled:smollm2-135m-instruct"
id = "big"
nodes = ["a", "b"]
[[instances]]
name = "fast"
model = "bundled:smollm2-135m-instruct"
id = "small"
nodes = ["b"]
aliases = ["claude-haiku-4-5"]
context_length = 512
[instances.serving]
max_batch_size = 2
"""


def test_each_instance_gets_its_own_spec_ports_and_names(tmp_path: Path) -> None:
    """Nodes, model, serving overrides, ports after the earlier instances' ranks, names."""
    spec, _ = check_cluster_file(write(tmp_path, TWO))
    main, fast = instance_specs(spec).values()
    assert [n.name for n in main.nodes] == ["a", "b"] and [n.name for n in fast.nodes] == ["b"]
    assert (main.cluster.name, fast.cluster.name) == ("home-main", "home-fast")
    assert (main.cluster.rank_port, fast.cluster.rank_port) == (52100, 52102)
    assert (main.serving.rank_api_port, fast.serving.rank_api_port) == (52200, 52201)
    assert (main.serving.max_batch_size, fast.serving.max_batch_size) == (4, 2)
    assert (main.model.served_id, fast.model.served_id) == ("big", "small")
    assert fast.model.aliases == ["claude-haiku-4-5"] and fast.model.context_length == 512
    assert not main.instances and not fast.instances


def test_a_file_without_instances_is_itself(tmp_path: Path) -> None:
    """The old single-model file: one instance, the spec unchanged (same name, ports)."""
    spec, _ = check_cluster_file(write(tmp_path, NODES))
    assert instance_specs(spec) == {"": spec}


def test_conflicts_are_named_with_their_field_paths(tmp_path: Path) -> None:
    """Duplicate names, unknown nodes, set ports, ids of two models, aliases on an id."""
    text = NODES + """
[[instances]]
name = "x"
model = "bundled:smollm2-135m-instruct"
id = "same"
nodes = ["a", "zz"]
[[instances]]
name = "x"
model = "/models/other"
id = "same"
nodes = ["b"]
aliases = ["same"]
[instances.serving]
rank_api_port = 9000
"""
    found = {issue.path: issue.message for issue in errors_of(tmp_path, text)}
    assert "instances[1].name" in found and "'x'" in found["instances[1].name"]
    assert "'zz' is not a [[nodes]] name" in found["instances[0].nodes[1]"]
    assert "assigned per instance" in found["instances[1].serving.rank_api_port"]
    assert "also the id of instances[0].id" in found["instances[1].id"]
    assert "already a model id" in found["instances[1].aliases[0]"]


def test_port_overlap_is_refused(tmp_path: Path) -> None:
    """The assigned rank ports running into rank 0's API ports are named."""
    text = TWO.replace("rank_api_port = 52200", "rank_api_port = 52101")
    found = {issue.path: issue.message for issue in errors_of(tmp_path, text)}
    assert "overlap at [52101" in found["cluster.rank_port"]


def test_an_instance_serving_value_is_checked(tmp_path: Path) -> None:
    """A wrong [instances.serving] value is reported at the instance's path."""
    found = {i.path: i.message for i in errors_of(tmp_path, TWO.replace("= 2\n", "= 0\n"))}
    assert "max_batch_size" in found["instances[1].serving"]
