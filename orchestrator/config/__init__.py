"""cluster.toml: the typed spec (`spec.py`), its loader (`load.py`), the rules across fields
(`rules.py`) and the summary `orchestrator validate` prints (`summary.py`)."""

from orchestrator.config.issues import ConfigErrors, ConfigIssue
from orchestrator.config.load import check_cluster_file, load_cluster
from orchestrator.config.spec import ClusterSpec, NodeSpec

__all__ = [
    "ClusterSpec",
    "ConfigErrors",
    "ConfigIssue",
    "NodeSpec",
    "check_cluster_file",
    "load_cluster",
]
