"""Where an `hf:ORG/NAME[@REV]` model lives: at the head, and on every node.

One rule for every machine: the model is the Hugging Face cache's snapshot directory

    <store>/models--ORG--NAME/snapshots/<commit>/

where <store> is `[model] store`, else this machine's HF cache (HF_HUB_CACHE, else
$HF_HOME/hub, else ~/.cache/huggingface/hub), written with `~` when it is under the home
directory so each node expands it to its own. At the head that directory is what
huggingface_hub wrote (symlinks into ../../blobs); on the nodes `sync` makes it a plain
directory. The commit is the pin: `pull` resolves the revision once and records it in the
cache's own `refs/<revision>` file; `up`, `sync` and `plan` read it from there and never
ask the hub, so every node serves the same commit until the next `pull`.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from contract.model_ref import COMMIT, HUB_PREFIX, Hub, parse_hub, parse_model_ref
from contract.settings import ModelSettings
from orchestrator.config import ClusterSpec


class LocationError(Exception):
    """The model cannot be located; the message says why and what to run."""


def hf_cache_dir() -> Path:
    """This machine's HF hub cache, read from the environment now (huggingface_hub reads it
    once at import)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def store_dir(model: ModelSettings) -> Path:
    """The cache directory the model lives in at this machine (absolute)."""
    return Path(model.store).expanduser() if model.store else hf_cache_dir()


def _portable(path: Path) -> str:
    """`path` with the home directory written as `~`: each node expands it to its own."""
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return path.as_posix()


def pinned_commit(model: ModelSettings) -> str | None:
    """The commit this machine's cache pins the model's revision to; None when never pulled."""
    ref = parse_hub(model.path)
    if ref.pinned:
        return ref.revision
    try:
        commit = (store_dir(model) / ref.folder / "refs" / ref.revision).read_text().strip()
    except OSError:
        return None
    return commit if COMMIT.match(commit) else None


def head_snapshot(model: ModelSettings, commit: str) -> Path:
    """The snapshot directory at this machine (where `pull` put it)."""
    return store_dir(model) / parse_hub(model.path).folder / "snapshots" / commit


def node_path(model: ModelSettings, commit: str) -> str:
    """The model's directory on every node, as a path each node expands itself."""
    store = model.store or _portable(hf_cache_dir())
    return f"{store.rstrip('/')}/{parse_hub(model.path).folder}/snapshots/{commit}"


def resolve_spec(spec: ClusterSpec, rerun: str = "orchestrator pull cluster.toml") -> ClusterSpec:
    """The spec with an hf: model replaced by its pinned directory (served under its
    NAME), as preflight, sync and the ranks use it; other specs as they are. Reads this
    machine's cache only; LocationError when the model was never pulled here."""
    model = spec.model
    ref = parse_model_ref(model.path)
    if not isinstance(ref, Hub):
        return spec
    commit = pinned_commit(model)
    if commit is None:
        raise LocationError(
            f"{model.path} is not pulled to this machine ({store_dir(model)} has no "
            f"{ref.folder}/refs/{ref.revision}): run `{rerun}`, or pin a commit "
            f"({HUB_PREFIX}{ref.repo_id}@<40-hex sha>) whose files every node already holds"
        )
    resolved = msgspec.structs.replace(model, path=node_path(model, commit), id=model.served_id)
    return msgspec.structs.replace(spec, model=resolved)
