"""`hf:ORG/NAME[@REV]`: the form of a hub model in cluster.toml, parsed and checked."""

from __future__ import annotations

import re
from dataclasses import dataclass

from contract.settings import HUB_PREFIX

DEFAULT_REVISION = "main"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?P<org>{_PART})/(?P<name>{_PART})(?:@(?P<rev>[A-Za-z0-9._/-]+))?$")
HUB_FORM = "hf:ORG/NAME or hf:ORG/NAME@REVISION (a branch, tag or commit)"


@dataclass(frozen=True)
class HubRef:
    """A parsed `hf:ORG/NAME[@REV]`."""

    repo_id: str  # ORG/NAME
    revision: str  # as written; DEFAULT_REVISION when none

    @property
    def spec(self) -> str:
        suffix = "" if self.revision == DEFAULT_REVISION else f"@{self.revision}"
        return f"{HUB_PREFIX}{self.repo_id}{suffix}"

    @property
    def folder(self) -> str:
        """The cache's directory name for the repo (huggingface_hub's repo_folder_name)."""
        return "models--" + self.repo_id.replace("/", "--")


def is_hub(path: str) -> bool:
    return path.startswith(HUB_PREFIX)


def hub_problem(path: str) -> str | None:
    """Why `path` (an hf: spec) is malformed, or None."""
    match = _HUB_ID.match(path.removeprefix(HUB_PREFIX))
    if match is None:
        return f"{path!r} is not {HUB_FORM}"
    if "--" in match["org"] + match["name"] or ".." in match["org"] + match["name"]:
        return f"{path!r}: the hub's names hold no '--' or '..'"
    return None


def parse(path: str) -> HubRef:
    """The HubRef of a valid hf: spec (check with hub_problem first); ValueError if not."""
    problem = hub_problem(path)
    if problem:
        raise ValueError(problem)
    match = _HUB_ID.match(path.removeprefix(HUB_PREFIX))
    assert match is not None
    return HubRef(f"{match['org']}/{match['name']}", match["rev"] or DEFAULT_REVISION)
