"""Talking to the Hugging Face hub (or a mirror): what a model's revision holds, and what
its refusals mean to the operator.

The endpoint, token and offline switch are read from the environment at each call
(HF_ENDPOINT, HF_TOKEN or `hf auth login`'s stored token, HF_HUB_OFFLINE) and passed to
huggingface_hub explicitly, because huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE
once, when it is imported.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.model_ref import Hub

if TYPE_CHECKING:  # huggingface_hub is imported where it is called: 0.3 s of every
    # `orchestrator up`, which meets the hub only for an hf: model
    from huggingface_hub.hf_api import RepoFile

DEFAULT_ENDPOINT = "https://huggingface.co"
# What mlx-lm itself downloads (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS; a test keeps them
# equal): weights, config, tokenizer, chat template, custom code. Not README, not the
# PyTorch or GGUF copies many repos also hold.
ALLOW_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]
# A file's id on the hub (git SHA-1, or SHA-256 for LFS files) names its blob in the cache.
BLOB_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
COMMIT_ID = re.compile(r"^[0-9a-f]{40}$")
CODE_PATTERNS = ("*.py",)  # a model's own code: fetched only under [model] trust_remote_code
LOGIN_FIX = "log in with `hf auth login`, or set HF_TOKEN to a token with read access"


class HubError(Exception):
    """The hub refused or could not be reached; the message names the repo and the fix."""


@dataclass(frozen=True)
class HubAccess:
    endpoint: str
    token: str | None
    offline: bool

    @classmethod
    def from_env(cls) -> HubAccess:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        from huggingface_hub import get_token

        return cls(endpoint, os.environ.get("HF_TOKEN") or get_token(), offline)


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    etag: str  # the blob's name in the cache: the LFS sha256, else the git blob sha1
    lfs: bool


@dataclass(frozen=True)
class RemoteListing:
    commit: str  # the revision resolved now
    files: list[RemoteFile]  # only allow_patterns()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def allow_patterns(trust_remote_code: bool) -> list[str]:
    """What a pull fetches: mlx-lm's patterns, without code files unless trusted."""
    if trust_remote_code:
        return list(ALLOW_PATTERNS)
    return [p for p in ALLOW_PATTERNS if p not in CODE_PATTERNS]


def remote_listing(
    ref: Hub, access: HubAccess, trust_remote_code: bool = False
) -> RemoteListing:
    """The commit the revision names now and its files mlx-lm needs (no code files unless
    `trust_remote_code`); raises HubError."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi(endpoint=access.endpoint, token=access.token or False)
    try:
        info = api.model_info(ref.repo_id, revision=ref.revision)
        commit = info.sha
        if commit is None or not COMMIT_ID.match(commit):
            # it names snapshots/<commit>/ in the cache: never a path of its own
            raise HubError(
                f"{access.endpoint} gave {ref.spec} the commit {str(commit)[:80]!r}, which is "
                "no git commit id (40 hex digits): refused (is HF_ENDPOINT a hub you trust?)"
            )
        tree = api.list_repo_tree(ref.repo_id, revision=commit, recursive=True)
        files = {f.path: f for f in tree if isinstance(f, RepoFile)}
    except HubError:
        raise
    except Exception as exc:
        raise explain(exc, ref, access) from exc
    wanted = filter_repo_objects(list(files), allow_patterns=allow_patterns(trust_remote_code))
    listing = [
        RemoteFile(p, files[p].size, _etag(files[p]), files[p].lfs is not None) for p in wanted
    ]
    for f in listing:  # each names a file of the cache's blobs/: never a path of its own
        if not BLOB_ID.match(f.etag):
            raise HubError(
                f"{access.endpoint} gave {f.path} of {ref.spec} the id {f.etag[:80]!r}, which "
                "is no SHA-1 or SHA-256: refused (is HF_ENDPOINT a hub you trust?)"
            )
    if not any(f.path == "config.json" for f in listing):
        raise HubError(
            f"{ref.spec} at {commit[:12]} has no config.json: not an mlx-lm model "
            "(look for its MLX conversion, e.g. under mlx-community/)"
        )
    return RemoteListing(commit, sorted(listing, key=lambda f: f.path))


def remote_config(ref: Hub, access: HubAccess, commit: str) -> dict[str, Any]:
    """The model's config.json at `commit`, read from the hub into a temporary directory:
    not into the HF cache, whose refs/ would then say the model was pulled. Raises HubError."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=access.endpoint, token=access.token or False)
    with tempfile.TemporaryDirectory(prefix="hub-config-") as folder:
        try:
            path = api.hf_hub_download(ref.repo_id, "config.json", revision=commit,
                                       local_dir=folder)
            config = json.loads(Path(str(path)).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise HubError(f"{ref.spec}: its config.json is not JSON: {exc}") from exc
        except Exception as exc:
            raise explain(exc, ref, access) from exc
    if not isinstance(config, dict):
        raise HubError(f"{ref.spec}: its config.json is not a JSON object")
    return config


def _etag(f: RepoFile) -> str:
    return f.lfs.sha256 if f.lfs is not None else f.blob_id


def explain(exc: BaseException, ref: Hub, access: HubAccess) -> HubError:
    """An operator's message for what huggingface_hub raised."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = access.endpoint
    status = _status(exc)
    if isinstance(exc, GatedRepoError) or status in {401, 403}:
        token = "with the token given" if access.token else "without a token"
        return HubError(
            f"{where} refused {ref.repo_id} {token} (HTTP {status}): it is gated or private. "
            f"Accept its terms at {where}/{ref.repo_id} with your account, then {LOGIN_FIX}"
        )
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"{ref.repo_id} has no revision {ref.revision!r} at {where}")
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        return HubError(
            f"{where} has no model {ref.repo_id}: check the name (ORG/NAME, as on the hub's "
            f"page); if it is private, {LOGIN_FIX}"
        )
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(f"HF_HUB_OFFLINE is set: {ref.spec} cannot be fetched from {where}")
    if isinstance(exc, httpx2.TransportError | OSError):
        return HubError(
            f"cannot reach {where} for {ref.spec}: {exc}; check the network, set HF_ENDPOINT "
            "to a mirror, or HF_HUB_OFFLINE=1 to use this machine's cache only"
        )
    if isinstance(exc, HfHubHTTPError):
        return HubError(f"{where} answered HTTP {status} for {ref.spec}: {exc}")
    return HubError(f"{ref.spec}: {type(exc).__name__}: {exc}")


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)
