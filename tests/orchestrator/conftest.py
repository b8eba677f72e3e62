"""Fixtures of the orchestrator's tests."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.hub_server import TEST_REPO, HubServer, ServedRepo, serve_dir
from testkit.supervisor_harness import harness  # noqa: F401


@pytest.fixture(scope="module")
def served(bundled_quantized_dir: Path) -> ServedRepo:
    """The bundled model's 4-bit directory, served as TEST_REPO."""
    return serve_dir(TEST_REPO, bundled_quantized_dir)


@pytest.fixture
def hub(served: ServedRepo) -> Iterator[HubServer]:
    """A local server speaking the hub's file API (HF_ENDPOINT), holding `served`."""
    with HubServer([served]) as server:
        yield server
