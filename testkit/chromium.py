"""A headless Chromium driven by playwright, for the status page's tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from testkit import require
from testkit.require import missing

CHROMIUM = "/usr/bin/chromium"
# As root in a container, with no network to phone home to.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A launched browser, closed after; the test is skipped where Chromium is missing
    (failed instead when $ORCHESTRATOR_TESTS_REQUIRE_CHROMIUM=1, as in CI)."""
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} is missing (apt-get install chromium)", require.CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()
