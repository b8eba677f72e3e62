"""`orchestrator pull` and `orchestrator models`, and what `up`, `sync` and `plan` do with an
hf: model first: pull it (`up` with [model] sync = true), then use its pinned directory."""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict
from pathlib import Path

import msgspec

from contract.model_ref import HUB_PREFIX, Hub, parse_model_ref
from orchestrator.config import ClusterSpec
from orchestrator.models.hub import HubError
from orchestrator.models.location import (
    LocationError,
    head_snapshot,
    node_path,
    pinned_commit,
    resolve_spec,
)
from orchestrator.models.progress import LogPullProgress, RichPullProgress
from orchestrator.models.pull import PullProgress, PullReport, pull

EXIT_OK, EXIT_FAILED, EXIT_NOT_STARTED, EXIT_INTERRUPTED = 0, 1, 2, 130
log = logging.getLogger("orchestrator.pull")


def pull_command(spec: ClusterSpec, config: Path, as_json: bool) -> int:
    if not isinstance(parse_model_ref(spec.model.path), Hub):
        print(
            f"{config}: model.path is {spec.model.path!r}: `pull` fetches hub models, "
            f'model.path = "{HUB_PREFIX}ORG/NAME"; a directory is copied by `orchestrator sync`',
            file=sys.stderr,
        )
        return EXIT_NOT_STARTED
    progress = PullProgress() if as_json else RichPullProgress(spec.model.path)
    try:
        report = pull(spec.model, progress)
    except HubError as exc:
        print(f"pull: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(
            f"interrupted: what arrived is kept; `orchestrator pull {config}` resumes",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if as_json:
        data = asdict(report) | {"node_path": node_path(spec.model, report.commit)}
        print(msgspec.json.format(msgspec.json.encode(data)).decode())
    else:
        print(render(report, node_path(spec.model, report.commit), config))
    return EXIT_OK


def render(report: PullReport, nodes_at: str, config: Path) -> str:
    fetched = (
        f"fetched {report.downloaded_bytes / 1e6:.1f} MB in {report.seconds:.1f} s "
        f"({report.rate_mb_s:.1f} MB/s)"
        if not report.offline
        else "offline: from the cache"
    )
    return "\n".join(
        [
            f"{report.model} at commit {report.commit}: {report.files} files, "
            f"{report.total_bytes / 1e6:.1f} MB in {report.path}",
            f"  {fetched}; resumed {report.resumed_bytes / 1e6:.1f} MB, "
            f"{report.cached_bytes / 1e6:.1f} MB were already here",
            f"  the nodes hold it at {nodes_at}: `orchestrator sync {config}` copies it there "
            "(`up` does, with [model] sync = true)",
        ]
    )


def located(spec: ClusterSpec, config: Path, pull_first: bool) -> ClusterSpec:
    """The spec `up`/`sync` run with: an hf: model pulled first when asked and not pulled
    yet (logged), then replaced by its pinned directory. Raises HubError or LocationError.

    A model already pulled is served at the commit pulled, without asking the hub: an
    offline boot still serves, and a new upstream commit never forces a reload on its own;
    `orchestrator pull` is what moves to it."""
    if not isinstance(parse_model_ref(spec.model.path), Hub):
        return spec
    commit = pinned_commit(spec.model)
    if pull_first and commit is not None and head_snapshot(spec.model, commit).is_dir():
        log.info("model %s: serving the pulled commit %s without asking the hub "
                 "(`orchestrator pull %s` updates it)", spec.model.path, commit[:12], config)
    elif pull_first:
        report = pull(spec.model, LogPullProgress(spec.model.path))
        for line in render(report, node_path(spec.model, report.commit), config).splitlines():
            log.info("%s", line.strip())
    resolved = resolve_spec(spec, f"orchestrator pull {config}")
    log.info("model %s is %s on every node", spec.model.path, resolved.model.path)
    return resolved


def located_or_exit(spec: ClusterSpec, config: Path, pull_first: bool) -> ClusterSpec | int:
    try:
        return located(spec, config, pull_first)
    except (HubError, LocationError) as exc:
        print(f"{config}: model.path: {exc}", file=sys.stderr)
        return EXIT_NOT_STARTED
    except KeyboardInterrupt:
        print(f"interrupted: `orchestrator pull {config}` resumes the pull", file=sys.stderr)
        return EXIT_INTERRUPTED
