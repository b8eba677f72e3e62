"""Every cluster.toml the README and docs show (a ```toml block with [[nodes]]) validates:
a reader who copies one gets a file `orchestrator validate` accepts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from orchestrator.config import ConfigErrors
from orchestrator.config.load import check_cluster_data
from testkit.docs_toml import cluster_blocks

BLOCKS = cluster_blocks()


def test_the_docs_show_complete_cluster_files() -> None:
    """The search finds the docs' full examples (an empty list would pass the test below)."""
    assert any(where.startswith("docs/placement.md") for where, _ in BLOCKS), BLOCKS


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_a_cluster_file_in_the_docs_validates(where: str, text: str) -> None:
    """The block parses as TOML and passes validation with no error, and with no warning
    but those about this machine (a key not set in this shell, a key file not here): a
    copied example must not leave a Mac on its Command Line Tools' Python 3.9."""
    try:
        _, warnings = check_cluster_data(tomllib.loads(text), Path(where))
    except ConfigErrors as errors:
        pytest.fail(f"{where}: " + "; ".join(f"{i.path}: {i.message}" for i in errors.issues))
    about_the_docs = [f"{w.path}: {w.message}" for w in warnings
                      if "in this shell" not in w.message and "on this machine" not in w.message]
    assert about_the_docs == [], where
