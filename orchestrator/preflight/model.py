"""Preflight's model check: every node holds the files its rank needs, and every file two
nodes hold is the same file (size and SHA-256).

In tensor mode (and at one rank) a rank needs every file; in pipeline mode only the
shards of its layers plus the files every stage loads (contract/model_shards.py), which
is what `orchestrator sync` sent it. So nodes are compared file by file, not by one
digest of the whole directory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from contract.fingerprint import ModelInfo, NodeFingerprint
from contract.model_shards import WeightShard, needed_files, stage_layers
from orchestrator.config import ClusterSpec
from orchestrator.preflight.failure import PreflightFailure

SHOWN = 3  # file names listed in one message


def model_preflight(
    spec: ClusterSpec, prints: Mapping[str, NodeFingerprint], placement: object
) -> Iterator[PreflightFailure]:
    """`placement`: a Placement, or a refusal / None (then every rank needs every file)."""
    sync = f"run `orchestrator sync cluster.toml` to copy {spec.model.path} there"
    held: dict[str, ModelInfo] = {}
    for node in spec.nodes:
        model = prints[node.name].model
        if model is None or not model.exists:
            reason = (model.error if model and model.error else None) or (
                f"{spec.model.path} is missing"
            )
            yield PreflightFailure(
                node.name, "model", reason,
                f"{sync} from this machine (`--from NODE` from a node), or set `sync = true` "
                "in [model]",
            )
            continue
        if model.error:
            yield PreflightFailure(
                node.name, "model", model.error,
                "fix the files, or re-copy them with `orchestrator sync cluster.toml`",
            )
        held[node.name] = model
    if any(not model.files for model in held.values()):  # a GGUF: one digest of it
        yield from _digests(held)
        return
    yield from _differing(held)
    shards = next((m.shards for m in held.values() if m.shards is not None), [])
    yield from _lacking(held, shards, placement, sync)


def _digests(held: Mapping[str, ModelInfo]) -> Iterator[PreflightFailure]:
    digests: dict[str, list[str]] = {}
    for name, model in held.items():
        digests.setdefault(model.digest or "?", []).append(name)
    if len(digests) > 1:
        groups = "; ".join(f"{', '.join(names)}: {digest}" for digest, names in digests.items())
        yield PreflightFailure(
            "*", "model",
            f"the model's files differ between nodes (SHA-256 manifest digests: {groups})",
            "run `orchestrator sync cluster.toml`: it re-sends only the files that differ "
            "from this machine's copy (`--from NODE` to take a node's)",
        )


def _differing(held: Mapping[str, ModelInfo]) -> Iterator[PreflightFailure]:
    versions: dict[str, dict[tuple[int, str], list[str]]] = {}
    for name, model in held.items():
        for f in model.files:
            versions.setdefault(f.path, {}).setdefault((f.size, f.sha256), []).append(name)
    differ = sorted(path for path, seen in versions.items() if len(seen) > 1)
    if not differ:
        return
    shown = [
        f"{path} ("
        + "; ".join(f"{', '.join(names)}: {sha[:16]}" for (_, sha), names in versions[path].items())
        + ")"
        for path in differ[:SHOWN]
    ]
    more = f" and {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
    yield PreflightFailure(
        "*", "model",
        f"the model's files differ between nodes: {', '.join(shown)}{more}",
        "run `orchestrator sync cluster.toml`: it re-sends only the files that differ "
        "from this machine's copy (`--from NODE` to take a node's)",
    )


def _lacking(
    held: Mapping[str, ModelInfo], shards: list[WeightShard], placement: object, sync: str
) -> Iterator[PreflightFailure]:
    every = sorted({f.path for m in held.values() for f in m.files} | {s.path for s in shards})
    for name, model in held.items():
        layers = stage_layers(placement, name)
        have = {f.path for f in model.files}
        lacking = [path for path in needed_files(every, shards, layers) if path not in have]
        if not lacking:
            continue
        stage = f" for its layers [{layers[0]}, {layers[1]})" if layers else ""
        more = f" and {len(lacking) - SHOWN} more" if len(lacking) > SHOWN else ""
        yield PreflightFailure(
            name, "model",
            f"lacks {len(lacking)} of the model's files it needs{stage}: "
            f"{', '.join(lacking[:SHOWN])}{more}",
            f"{sync}: it sends each node the files its rank needs",
        )

