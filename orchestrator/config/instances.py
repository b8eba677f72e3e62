"""`[[instances]]`: each instance becomes a single-model ClusterSpec of its own.

Launch, preflight, adoption, sync and supervision all work on one model over one gang;
deriving a spec per instance keeps them so. An instance's spec has its nodes (in the
order it names them), its model, its `[instances.serving]` over the file's `[serving]`,
and its own ports and name:

- name: `<cluster>-<instance>`, so its state file and launch secret are its own;
- ring / coordinator ports: `[cluster] rank_port` plus the ranks of the instances before
  it (instance k's rank r listens on rank_port + sum(ranks of instances 0..k-1) + r);
- rank 0's API: `[serving] rank_api_port` + k.

A file without `[[instances]]` is one instance, the file's own spec, unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import msgspec

from contract.settings import ServingSettings
from orchestrator.config.issues import ConfigIssue
from orchestrator.config.rules import semantic_issues
from orchestrator.config.spec import ClusterSpec, InstanceSpec

ASSIGNED_PORTS = ("rank_api_port",)  # [instances.serving] may not set them


def instance_specs(spec: ClusterSpec) -> dict[str, ClusterSpec]:
    """Each instance's own spec by instance name; {"": spec} without `[[instances]]`."""
    if not spec.instances:
        return {"": spec}
    derived: dict[str, ClusterSpec] = {}
    offset = 0
    for index, instance in enumerate(spec.instances):
        derived[instance.name] = derive(spec, instance, index, offset)
        offset += len(instance.nodes)
    return derived


def derive(spec: ClusterSpec, instance: InstanceSpec, index: int, offset: int) -> ClusterSpec:
    """The single-model spec of `instance`, the index-th, after `offset` ranks before it."""
    by_name = {node.name: node for node in spec.nodes}
    nodes = [by_name[name] for name in instance.nodes if name in by_name]
    serving = _serving(spec, instance)
    serving = msgspec.structs.replace(
        serving, rank_api_port=spec.serving.rank_api_port + index
    )
    chosen = set(instance.nodes)
    model = msgspec.structs.replace(
        spec.model,
        path=instance.model,
        id=instance.id,
        aliases=list(instance.aliases),
        context_length=instance.context_length or spec.model.context_length,
    )
    cluster = msgspec.structs.replace(
        spec.cluster,
        name=f"{spec.cluster.name}-{instance.name}",
        rank_port=spec.cluster.rank_port + offset,
        parallel=instance.parallel or spec.cluster.parallel,
    )
    return msgspec.structs.replace(
        spec,
        nodes=nodes,
        links=[link for link in spec.links if set(link.between) <= chosen],
        cluster=cluster,
        model=model,
        serving=serving,
        instances=[],
    )


def _serving(spec: ClusterSpec, instance: InstanceSpec) -> ServingSettings:
    merged = {**msgspec.to_builtins(spec.serving), **instance.serving}
    return msgspec.convert(merged, ServingSettings)


def instance_issues(spec: ClusterSpec) -> list[ConfigIssue]:
    """Every conflict between instances, and each instance's own spec's rules, with the
    instance's field path."""
    if not spec.instances:
        return []
    issues = list(_names(spec)) + list(_nodes(spec)) + list(_ids(spec)) + list(_ports(spec))
    if any(issue.severity == "error" for issue in issues):
        return issues
    offset = 0
    for index, instance in enumerate(spec.instances):
        path = f"instances[{index}]"
        try:
            derived = derive(spec, instance, index, offset)
        except msgspec.ValidationError as exc:
            issues.append(ConfigIssue(f"{path}.serving", str(exc), "fix the value"))
            continue
        finally:
            offset += len(instance.nodes)
        issues += [_relocate(issue, path) for issue in semantic_issues(derived)
                   if issue.path.startswith(("model", "serving.", "cluster.parallel"))]
    return list(dict.fromkeys(issues))


def _relocate(issue: ConfigIssue, path: str) -> ConfigIssue:
    """An issue of an instance's derived spec at the instance's own field."""
    where = issue.path
    if where == "model.path":
        where = f"{path}.model"
    elif where.startswith("model."):
        where = f"{path}.{where.removeprefix('model.')}"
    elif where.startswith(("serving.", "cluster.parallel")):
        where = f"{path}.{where.rpartition('.')[2]}" if where.startswith("cluster.") else (
            f"{path}.{where}")
    return ConfigIssue(where, issue.message, issue.fix, issue.severity)


def _names(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    counts = Counter(instance.name for instance in spec.instances)
    for index, instance in enumerate(spec.instances):
        if counts[instance.name] > 1:
            yield ConfigIssue(f"instances[{index}].name", f"{instance.name!r} is used by "
                              f"{counts[instance.name]} instances", "give each a unique name")


def _nodes(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    known = [node.name for node in spec.nodes]
    for index, instance in enumerate(spec.instances):
        path = f"instances[{index}].nodes"
        if not instance.nodes:
            yield ConfigIssue(path, "names no node", f"name some of {known}")
        for at, name in enumerate(instance.nodes):
            if name not in known:
                yield ConfigIssue(f"{path}[{at}]", f"{name!r} is not a [[nodes]] name",
                                  f"use one of {known}")
        repeated = sorted(name for name, n in Counter(instance.nodes).items() if n > 1)
        if repeated:
            yield ConfigIssue(path, f"names {repeated} more than once", "name each node once")


def _ids(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    """An alias must not be another model's id or alias: it would route two ways."""
    owner: dict[str, tuple[str, str]] = {}  # name -> (model path of its id, field path)
    for index, instance in enumerate(spec.instances):
        served = instance.id or _default_id(spec, instance)
        owner.setdefault(served, (instance.model, f"instances[{index}].id"))
    for index, instance in enumerate(spec.instances):
        served = instance.id or _default_id(spec, instance)
        model, where = owner[served]
        if model != instance.model:
            yield ConfigIssue(f"instances[{index}].id", f"{served!r} is also the id of "
                              f"{where} (another model: {model})",
                              "give each model its own id (replicas share one model)")
        for at, alias in enumerate(instance.aliases):
            other = owner.get(alias)
            if (other and other[0] != instance.model) or alias == served:
                yield ConfigIssue(f"instances[{index}].aliases[{at}]",
                                  f"{alias!r} is already a model id", "remove the alias")


def _default_id(spec: ClusterSpec, instance: InstanceSpec) -> str:
    return msgspec.structs.replace(spec.model, path=instance.model, id=None).served_id


def _ports(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    for index, instance in enumerate(spec.instances):
        for key in ASSIGNED_PORTS:
            if key in instance.serving:
                yield ConfigIssue(
                    f"instances[{index}].serving.{key}", "ports are assigned per instance",
                    f"remove it; set [serving] {key} for the first instance's (the next "
                    "instances take the following ports)")
    ranks = sum(len(instance.nodes) for instance in spec.instances)
    rank_ports = range(spec.cluster.rank_port, spec.cluster.rank_port + ranks)
    api_ports = range(spec.serving.rank_api_port,
                      spec.serving.rank_api_port + len(spec.instances))
    clash = sorted(set(rank_ports) & set(api_ports) | ({spec.api.port} & set(rank_ports)) |
                   ({spec.api.port} & set(api_ports)))
    if clash:
        yield ConfigIssue("cluster.rank_port", f"the instances' rank ports {_span(rank_ports)}"
                          f", rank 0 API ports {_span(api_ports)} and api.port {spec.api.port} "
                          f"overlap at {clash}",
                          "move [cluster] rank_port or [serving] rank_api_port apart")
    if rank_ports.stop > 65536 or api_ports.stop > 65536:
        yield ConfigIssue("cluster.rank_port", "the assigned ports run past 65535",
                          "lower [cluster] rank_port or [serving] rank_api_port")


def _span(ports: range) -> str:
    return f"{ports.start}-{ports.stop - 1}"
