"""`bench` with `[[instances]]`: which model ids it sends by default."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import check_cluster_file
from orchestrator.loadgen.command import served_ids
from testkit.config_files import write

NODES = """
[[nodes]]
name = "a"
ip = "127.0.0.1"
[[nodes]]
name = "b"
ip = "127.0.0.1"
"""


def test_each_distinct_id_once_replicas_together(tmp_path: Path) -> None:
    """Two replicas of big and one small: big, then small; the old file: its one model."""
    text = NODES + "".join(
        f'[[instances]]\nname = "{name}"\nmodel = "bundled:smollm2-135m-instruct"\n'
        f'id = "{ident}"\nnodes = ["{node}"]\n'
        for name, ident, node in [("big-a", "big", "a"), ("big-b", "big", "b"),
                                  ("small", "small", "a")])
    spec, _ = check_cluster_file(write(tmp_path, text))
    assert served_ids(spec) == ["big", "small"]
    alone, _ = check_cluster_file(write(tmp_path, NODES))
    assert served_ids(alone) == [alone.model.served_id]
