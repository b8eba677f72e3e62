"""A model directory whose tokenizer names its own class (`auto_map`) in a .py that writes
a marker file when imported: what a hostile model repository would do at load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CODE_FILE = "marker_tokenizer.py"


def with_tokenizer_code(source: Path, dest: Path, marker: Path) -> Path:
    """Copy the model at `source` to `dest`, its tokenizer asking for CODE_FILE's class,
    which writes `marker` when its module runs."""
    shutil.copytree(source, dest)
    config_file = dest / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["auto_map"] = {"AutoTokenizer": ["marker_tokenizer.MarkerTokenizer", None]}
    config.pop("tokenizer_class", None)  # only the repository's own class names it
    config_file.write_text(json.dumps(config))
    (dest / CODE_FILE).write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class MarkerTokenizer(PreTrainedTokenizerFast):\n"
        "    pass\n"
    )
    return dest
