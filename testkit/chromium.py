"""A headless Chromium driven by playwright, for the status page's tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
REQUIRE_ENV = "ORCHESTRATOR_TESTS_REQUIRE_CHROMIUM"
# As root in a container, with no network to phone home to.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A launched browser, closed after; the test is skipped where Chromium is missing
    (failed instead when $ORCHESTRATOR_TESTS_REQUIRE_CHROMIUM=1, as in CI)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{CHROMIUM} is missing and {REQUIRE_ENV}=1")
        pytest.skip("chromium is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()
