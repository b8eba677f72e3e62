"""The gateway's status page opened in a browser (testkit/chromium.py), for its tests."""

from __future__ import annotations

from typing import Any


def open_status_page(browser: Any, url: str, viewport: dict[str, int],
                     key: str | None = None) -> Any:
    """The page at `viewport`, given `key` when it asks for one, once it shows READY."""
    page = browser.new_page(viewport=viewport)
    page.goto(f"{url}/")
    if key is not None:
        page.fill("#key", key)
        page.click("#key-form button")
    page.wait_for_function("document.getElementById('state').textContent === 'READY'")
    return page


def shows_no_horizontal_scroll(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))
