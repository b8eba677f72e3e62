"""`orchestrator pull` and `orchestrator models`, and what `up`, `sync` and `plan` do with an
hf: model first: pull it (`up` with [model] sync = true), then use its pinned directory."""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict
from pathlib import Path

import msgspec

from contract.model_ref import HUB_PREFIX, Hub, parse_model_ref
from contract.settings import ModelSettings
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
    """Each distinct hf: model the file serves, pulled once: [model], or with
    `[[instances]]` every instance's (the output names the instances)."""
    served = hub_models(spec)
    if not served:
        print(_nothing_to_pull(spec, config), file=sys.stderr)
        return EXIT_NOT_STARTED
    code, shown = EXIT_OK, []
    for path, names in served.items():
        model = msgspec.structs.replace(spec.model, path=path) if spec.instances else spec.model
        label = f"{path} (instance {', '.join(names)})" if names else path
        progress = PullProgress() if as_json else RichPullProgress(label)
        try:
            report = pull(model, progress)
        except HubError as exc:
            print(f"pull: {label}: {exc}" if names else f"pull: {exc}", file=sys.stderr)
            code = EXIT_FAILED
            continue
        except KeyboardInterrupt:
            print(f"interrupted: what arrived is kept; `orchestrator pull {config}` resumes",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        at = node_path(model, report.commit)
        shown.append(asdict(report) | {"node_path": at} | ({"instances": names} if names else {})
                     if as_json else render(report, at, config, names))
    if as_json and shown:
        data = shown if spec.instances else shown[0]  # a file without: one object, as ever
        print(msgspec.json.format(msgspec.json.encode(data)).decode())
    elif shown:
        print("\n".join(str(text) for text in shown))
    return code


def hub_models(spec: ClusterSpec) -> dict[str, list[str]]:
    """Each distinct hf: model the file serves: the names of the instances serving it
    ([] for a file without [[instances]], whose [model] it is)."""
    if not spec.instances:
        return {spec.model.path: []} if isinstance(parse_model_ref(spec.model.path), Hub) else {}
    served: dict[str, list[str]] = {}
    for instance in spec.instances:
        if isinstance(parse_model_ref(instance.model), Hub):
            served.setdefault(instance.model, []).append(instance.name)
    return served


def _nothing_to_pull(spec: ClusterSpec, config: Path) -> str:
    if spec.instances:
        return (f"{config}: no [[instances]] model is hf:ORG/NAME: `pull` fetches hub models; "
                "a directory is copied by `orchestrator sync`")
    return (f"{config}: model.path is {spec.model.path!r}: `pull` fetches hub models, "
            f'model.path = "{HUB_PREFIX}ORG/NAME"; a directory is copied by `orchestrator sync`')


def render(report: PullReport, nodes_at: str, config: Path, instances: list[str] | None = None
           ) -> str:
    fetched = (
        f"fetched {report.downloaded_bytes / 1e6:.1f} MB in {report.seconds:.1f} s "
        f"({report.rate_mb_s:.1f} MB/s)"
        if not report.offline
        else "offline: from the cache"
    )
    return "\n".join(
        [
            f"{report.model}{_serving(instances)} at commit {report.commit}: {report.files} files, "
            f"{report.total_bytes / 1e6:.1f} MB in {report.path}",
            f"  {fetched}; resumed {report.resumed_bytes / 1e6:.1f} MB, "
            f"{report.cached_bytes / 1e6:.1f} MB were already here",
            f"  the nodes hold it at {nodes_at}: `orchestrator sync {config}` copies it there "
            "(`up` does, with [model] sync = true)",
        ]
    )


def _serving(instances: list[str] | None) -> str:
    return f" (instance {', '.join(instances)})" if instances else ""


def located(spec: ClusterSpec, config: Path, pull_first: bool) -> ClusterSpec:
    """The spec `up`/`sync` run with: an hf: model pulled first when asked and not pulled
    yet (logged), then replaced by its pinned directory. Raises HubError or LocationError.

    A model already pulled is served at the commit pulled, without asking the hub: an
    offline boot still serves, and a new upstream commit never forces a reload on its own;
    `orchestrator pull` is what moves to it.

    With `[[instances]]`, each instance's model is located so (each distinct hub model
    pulled once), and served under its NAME unless the instance sets an id."""
    if spec.instances:
        return _located_instances(spec, config, pull_first)
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


def _located_instances(spec: ClusterSpec, config: Path, pull_first: bool) -> ClusterSpec:
    done: dict[str, ModelSettings] = {}  # an instance's model path: where it is
    instances = []
    for index, instance in enumerate(spec.instances):
        if instance.model not in done:
            model = msgspec.structs.replace(spec.model, path=instance.model, id=None)
            alone = msgspec.structs.replace(spec, model=model, instances=[])
            try:
                done[instance.model] = located(alone, config, pull_first).model
            except (HubError, LocationError) as exc:
                raise type(exc)(f"instances[{index}].model: {exc}") from None
        where = done[instance.model]
        instances.append(msgspec.structs.replace(
            instance, model=where.path, id=instance.id or where.id))
    return msgspec.structs.replace(spec, instances=instances)


def located_or_exit(spec: ClusterSpec, config: Path, pull_first: bool) -> ClusterSpec | int:
    try:
        return located(spec, config, pull_first)
    except (HubError, LocationError) as exc:
        where = "" if spec.instances else "model.path: "  # an instance's error names its field
        print(f"{config}: {where}{exc}", file=sys.stderr)
        return EXIT_NOT_STARTED
    except KeyboardInterrupt:
        print(f"interrupted: `orchestrator pull {config}` resumes the pull", file=sys.stderr)
        return EXIT_INTERRUPTED
