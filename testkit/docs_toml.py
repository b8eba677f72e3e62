"""The cluster files the README and docs show: each ```toml block holding [[nodes]], with
where it is, for the tests that validate and plan them as a reader would copy them."""

from __future__ import annotations

import re

from testkit.paths import ROOT

TOML_BLOCK = re.compile(r"```toml\n(.*?)```", re.S)


def cluster_blocks() -> list[tuple[str, str]]:
    """(file:line, text) of each ```toml block holding [[nodes]] in README.md and docs/."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text()
        for block in TOML_BLOCK.finditer(text):
            if "[[nodes]]" in block.group(1):
                line = text.count("\n", 0, block.start()) + 1
                found.append((f"{doc.relative_to(ROOT)}:{line}", block.group(1)))
    return found
