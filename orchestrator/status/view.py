"""`orchestrator status`: the cluster at a glance, read from the running orchestrator."""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from contract.placement import RankShare
from orchestrator.console import report_console
from orchestrator.status.model import ClusterStatus, NodeStatus

GIB = 1024**3
STATE_STYLE = {"ready": "bold green", "failed": "bold red", "stopped": "dim"}


def render_status(status: ClusterStatus) -> Group:
    style = STATE_STYLE.get(status.state, "bold yellow")
    head = Text.assemble(
        (f"{status.cluster}", "bold"),
        "  ",
        (status.state.upper(), style),
        f"  {status.reason}" if status.reason else "",
        f"\n{status.backend} backend, {len(status.ranks)} ranks, model {status.model}, "
        f"API {status.api_url}, launch {status.launch_id or '-'}, restarts {status.restarts}"
        + (f", last cause {status.last_cause}" if status.last_cause else ""),
    )
    placement = status.placement
    mode = Text(f"{placement.mode} parallel: {placement.reason}" if placement else "")
    parts: list[Text | Table] = [head, mode, _nodes_table(status)]
    if status.instances:
        parts.append(_instances_table(status))
    return Group(*parts, _ranks_table(status), _serving_line(status))


def _instances_table(status: ClusterStatus) -> Table:
    """[[instances]]: what each serves, where, in which mode and state."""
    table = Table(title="instances", title_justify="left", expand=False)
    for column in ("instance", "serves", "nodes", "ranks", "mode", "state", "restarts"):
        table.add_column(column)
    for one in status.instances:
        style = STATE_STYLE.get(one.state, "bold yellow")
        table.add_row(
            one.name,
            ", ".join([one.model, *one.aliases]),
            ", ".join(one.nodes),
            str(len(one.ranks)),
            one.mode or "-",
            f"[{style}]{one.state}[/]" + (f" {one.reason}" if one.reason else ""),
            str(one.restarts) + (f" ({one.last_cause})" if one.last_cause else ""),
        )
    return table


def _nodes_table(status: ClusterStatus) -> Table:
    table = Table(title="nodes", title_justify="left", expand=False)
    for column in ("node", "host", "chip", "memory used/total (ranks)", "load", "mlx", "blas",
                   "rdma", "agent"):
        table.add_column(column)
    for node in status.nodes:
        table.add_row(
            node.name,
            node.hostname or node.host,
            node.chip or "-",
            _memory(node),
            f"{node.load_1m:.1f}" if node.load_1m is not None and not node.usage_stale else "-",
            node.mlx_version or "-",
            _blas(node.blas),
            node.rdma or "-",
            "[green]up[/]" if node.connected else "[red]down[/]",
        )
    return table


def _blas(blas: str) -> str:
    """The kind only (the fingerprint has the path or the install hint)."""
    if not blas:
        return "-"
    kind = blas.split(" ", 1)[0]
    return f"[yellow]{kind}[/]" if kind == "reference" else kind


def _memory(node: NodeStatus) -> str:
    if node.usage_stale:
        return f"[yellow]stale ({node.usage_age_s or 0:.0f} s old)[/]"
    if not node.memory_total_bytes:
        return "-"
    used = node.memory_total_bytes - node.memory_available_bytes
    return (
        f"{used / GIB:.1f}/{node.memory_total_bytes / GIB:.1f} GiB "
        f"({node.memory_ranks_bytes / GIB:.1f})"
    )


def _ranks_table(status: ClusterStatus) -> Table:
    table = Table(title="ranks", title_justify="left", expand=False)
    several = bool(status.instances)
    for column in ("instance",) * several + (
            "rank", "node", "share", "pid", "state", "uptime", "last exit"):
        table.add_column(column)
    shares = {share.rank: share for share in status.placement.ranks} if status.placement else {}
    for rank in status.ranks:
        share = shares.get(rank.rank)
        table.add_row(
            *([rank.instance] if several else []),
            str(rank.rank),
            rank.node,
            _share(share) if share else "-",
            str(rank.pid or "-"),
            rank.state,
            _duration(rank.uptime_s) if rank.pid else "-",
            rank.last_exit or "-",
        )
    return table


def _share(share: RankShare) -> str:
    """Pipeline: the layers as a half-open range; both modes: the weights' size."""
    size = f"{share.weight_bytes / GIB:.2f} GiB"
    return f"layers [{share.layers[0]}, {share.layers[1]}) {size}" if share.layers else size


def _serving_line(status: ClusterStatus) -> Text:
    serving = status.serving
    drafts = serving.draft_tokens_total
    speculation = (
        f", drafts accepted {serving.accepted_tokens_total}/{drafts} "
        f"({serving.accepted_tokens_total / drafts:.0%})" if drafts else ""
    )
    return Text(
        f"serving: {serving.requests_running} running, {serving.requests_waiting} waiting, "
        f"{serving.generation_tokens_total} tokens generated, "
        f"{serving.tokens_per_second:.1f} tokens/s{speculation}"
    )


def _duration(seconds: float) -> str:
    return (
        time.strftime("%H:%M:%S", time.gmtime(seconds))
        if seconds < 86400
        else f"{seconds / 86400:.1f}d"
    )


def print_status(status: ClusterStatus) -> None:
    report_console().print(render_status(status))
