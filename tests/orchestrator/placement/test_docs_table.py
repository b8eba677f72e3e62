"""docs/placement.md's popular-models table is what the code decides today
(scripts/placement_table.py regenerates it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[3]


def test_placement_table_matches_the_code() -> None:
    spec = importlib.util.spec_from_file_location("placement_table",
                                                  ROOT / "scripts" / "placement_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "docs" / "placement.md").read_text(encoding="utf-8")
    shown = page.split("<!-- placement-table: generated -->\n")[1].split("<!-- /placement-table")[0]
    assert shown == module.table(), "run: python scripts/placement_table.py, paste into the page"
