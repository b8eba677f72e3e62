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


# What makes the page wider than the window (what to fix), none if it fits: elements past
# its right edge or with content past their own, outside any scrolling box (a table's).
WIDER_THAN_THE_WINDOW = """document.documentElement.scrollWidth <= innerWidth ? [] :
  [...document.querySelectorAll("body *")]
    .filter((e) => {
      for (let a = e.parentElement; a; a = a.parentElement)
        if (getComputedStyle(a).overflowX !== "visible") return false;
      return e.getBoundingClientRect().right > innerWidth + 0.5
        || e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === "visible";
    })
    .map((e) => `${e.tagName}#${e.id} ${(e.textContent || "").slice(-60)}`)"""


def shows_no_horizontal_scroll(page: Any) -> bool:
    """True when the page fits the window's width; else it prints what sticks out."""
    wide = page.evaluate(WIDER_THAN_THE_WINDOW)
    if wide:
        print("wider than the window:", wide)
    return not wide
