"""The commented cluster.toml `init` writes: what was found on each host and why the file
says what it says, as comments beside the values. Strings are written as TOML basic
strings (JSON's escapes are TOML's), so no probed text can break the file."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass

from contract.settings import DEFAULT_MODEL
from orchestrator.init.cables import Cable
from orchestrator.init.layout import Layout, LinkPlan
from orchestrator.init.probe import DEFAULT_SSH_PORT, HostProbe, TbPort

BOOTSTRAP_VENV = "~/.venvs/mlx-cluster"


@dataclass(frozen=True)
class Access:
    """How the orchestrator reaches the nodes, from init's options."""

    identity_file: str | None = None
    known_hosts: str | None = None
    python: str | None = None
    accept_new_host_keys: bool = False


def q(value: str) -> str:
    return json.dumps(value)


def _wrap(text: str) -> list[str]:
    indent = "#   " + " " * (len(text) - len(text.lstrip()))
    return textwrap.wrap(text.strip(), 92, initial_indent=indent,
                         subsequent_indent=indent + "  ")


def render(hosts: list[HostProbe], names: list[str], layout: Layout, access: Access,
           cluster_name: str, model: str | None) -> str:
    lines = [
        f"# Written by `orchestrator init {' '.join(h.target for h in hosts)}`.",
        "# Check it with `orchestrator validate` and `orchestrator plan` (docs/mac-setup.md).",
        "#",
        f"# backend = {q(layout.backend)}, because",
        *(line for reason in layout.reasons for line in _wrap(reason)),
        *_cable_comments(layout, names),
        "",
        "[cluster]",
        f"name = {q(cluster_name)}",
        f"backend = {q(layout.backend)}",
        "",
        "[model]",
        f"path = {q(model or DEFAULT_MODEL)}"
        + ("" if model else "   # the bundled demo model: put yours here"),
    ]
    ssh_nodes = [h for h in hosts if h.target != "local"]
    if ssh_nodes and access.python is None:
        lines += ["", "[bootstrap]",
                  f"venv = {q(BOOTSTRAP_VENV)}   # `orchestrator bootstrap` makes it on the "
                  "ssh nodes, with this machine's versions"]
    owners = {p.port.uuid: f"{names[i]} port {p.port.receptacle}"
              for i, h in enumerate(hosts) for p in h.thunderbolt}
    for rank, index in enumerate(layout.order):
        node = _node(hosts[index], names[index], rank, layout, index, access, owners)
        lines += ["", *node]
    for link in layout.links:
        lines += ["", *_link(link, names)]
    lines += _proposed_comments(layout, names)
    lines += _command_comments(layout, hosts, names)
    lines += _instances_comment([names[i] for i in layout.order])
    return "\n".join(lines) + "\n"


def _proposed_comments(layout: Layout, names: list[str]) -> list[str]:
    """A mesh has no [[links]] to hold its cables' addresses: they are said here."""
    if not layout.proposed:
        return []
    lines = ["", "# Addresses proposed for the mesh's cables (RDMA needs one on each end):"]
    for cable, ips in layout.proposed:
        a, b = sorted(cable.ends, key=lambda end: end.host)
        lines.append(f"#   {names[a.host]} {a.interface} {ips[0]}/30 <-> "
                     f"{names[b.host]} {b.interface} {ips[1]}/30")
    return lines


def _instances_comment(names: list[str]) -> list[str]:
    """Several models or replicas are [[instances]] (docs/configuration.md); an example,
    commented out so the file stays one model on every node."""
    return [
        "",
        "# Several models, or replicas of one: an [[instances]] table each, a gang on some of",
        '# the nodes (docs/configuration.md, "[[instances]]"). For example:',
        "# [[instances]]",
        '# name = "chat"',
        '# model = "hf:mlx-community/Qwen3-4B-4bit"',
        f"# nodes = [{', '.join(q(n) for n in names[:2])}]",
    ]


def _cable_comments(layout: Layout, names: list[str]) -> list[str]:
    if not layout.cables:
        return ["#", "# No cables found between the hosts."]
    used = {id(link.cable) for link in layout.links} | {id(cable) for cable in layout.mesh}
    found = ["#", "# Cables found:"]
    for cable in layout.cables:
        found.append(f"#   {describe_cable(cable, names)}"
                     + ("" if id(cable) in used else "   (not used: not between ring neighbours"
                        " or more than the other pairs have)"))
    return found


def describe_cable(cable: Cable, names: list[str]) -> str:
    ends = " <-> ".join(
        f"{names[end.host]} {end.interface or '?'}"
        + (f" {end.address.with_prefixlen}" if end.address else " (no IPv4 address)")
        for end in cable.ends
    )
    if cable.kind != "thunderbolt":
        return f"{ends}, {cable.kind}"
    version = {True: "Thunderbolt 5", False: "Thunderbolt 4", None: "Thunderbolt"}
    speed = f" ({cable.speed})" if cable.speed else ""
    return f"{ends}, {version[cable.thunderbolt5]}{speed}"


def _node(host: HostProbe, name: str, rank: int, layout: Layout, index: int,
          access: Access, owners: dict[str, str]) -> list[str]:
    lines = [f"# {name} (rank {rank}): {summary(host)}", *_found(host, owners), "[[nodes]]",
             f"name = {q(name)}"]
    if host.target == "local":
        lines.append('transport = "local"')
    else:
        lines += ['transport = "ssh"', f"ssh = {q(host.target)}"]
        if access.identity_file:
            lines.append(f"identity_file = {q(access.identity_file)}")
        if access.known_hosts:
            lines.append(f"known_hosts = {q(access.known_hosts)}")
        if access.accept_new_host_keys:
            lines.append("accept_new_host_keys = true")
        if host.ssh_port != DEFAULT_SSH_PORT:
            lines.append(f"ssh_port = {host.ssh_port}")
        if access.python:
            lines.append(f"python = {q(access.python)}")
    if index in layout.node_ips:
        why = "LAN address: JACCL's coordinator" if layout.backend == "jaccl" else \
            "its address on the network the ranks share"
        lines.append(f"ip = {q(layout.node_ips[index])}   # {why}")
    if index in layout.node_rdma:
        devices = ", ".join(q(d) for d in layout.node_rdma[index])
        lines.append(f"rdma = [{devices}]   # towards each rank, \"\" at its own")
    memory = host.usable_memory_gb()
    if memory:
        lines.append(f"memory_gb = {memory:g}   # {memory_source(host)}")
    return lines


def summary(host: HostProbe) -> str:
    parts = [host.chip or "chip unknown"]
    if host.memory_bytes:
        parts.append(f"{host.memory_bytes / 1024**3:.0f} GiB")
    parts.append(f"{host.os_name} {host.os_version}".strip() or host.system)
    if host.python:
        parts.append(f"Python {host.python.version}")
        parts.append(f"mlx {host.python.mlx}" if host.python.mlx else "no mlx")
    else:
        parts.append("no Python found")
    return ", ".join(parts)


def _found(host: HostProbe, owners: dict[str, str]) -> list[str]:
    """What init saw on the host; a port's peer by its probed name when it is one of them."""
    lines = []
    addrs = [f"{i.name} {a.with_prefixlen}" for i in host.interfaces if not i.loopback
             for a in i.ipv4]
    if addrs:
        lines.append(f"#   addresses: {', '.join(addrs)}")
    if host.thunderbolt:
        ports = [f"{p.port.receptacle} ({p.interface or '?'}) -> {_peer(p, owners)}"
                 + (f", {p.port.speed}" if p.port.speed else "") for p in host.thunderbolt]
        lines.append(f"#   Thunderbolt ports: {'; '.join(ports)}")
    if host.is_mac:
        active = set(host.rdma_active)
        devices = [d + (" (active)" if d in active else "") for d in host.rdma_devices]
        lines.append(f"#   RDMA: {host.rdma_status}; devices: {', '.join(devices) or 'none'}")
    lines += [f"#   not probed: {note}" for note in host.notes]
    return lines


def _peer(port: TbPort, owners: dict[str, str]) -> str:
    """A port's other end: a probed host by name, another Mac, a drive or dock, nothing."""
    if port.port.connected_to:
        return owners.get(port.port.connected_to) or port.port.peer_name or "a Mac"
    if port.port.device:
        return f"{port.port.device} (not a Mac)"
    return "nothing"


def memory_source(host: HostProbe) -> str:
    if not host.is_mac:
        return "the RAM; lower it to keep room for other programs"
    if host.wired_limit_mb:
        return "what the GPU may use: iogpu.wired_limit_mb"
    if host.python and host.python.working_set:
        return "what the GPU may use: Metal's recommended working set"
    return "75% of RAM, Metal's usual default (MLX was not there to ask)"


def _link(link: LinkPlan, names: list[str]) -> list[str]:
    a, b = (link.cable.end(h) for h in link.between)
    lines = [f"[[links]]   # {names[a.host]} {a.interface} <-> {names[b.host]} {b.interface}"
             + (f", {link.cable.speed}" if link.cable.speed else ""),
             f"between = [{q(names[link.between[0]])}, {q(names[link.between[1]])}]",
             f"ips = [{q(link.ips[0])}, {q(link.ips[1])}]"
             + ("   # proposed: give the ports these addresses (the commands below)"
                if link.proposed else "")]
    if link.rdma:
        lines.append(f"rdma = [{q(link.rdma[0])}, {q(link.rdma[1])}]")
    return lines


def _command_comments(layout: Layout, hosts: list[HostProbe], names: list[str]) -> list[str]:
    if not layout.commands:
        return []
    lines = ["", "# Before `orchestrator up`, run on each host (or `init --apply`):"]
    for index, commands in layout.commands.items():
        lines.append(f"#   on {names[index]} ({hosts[index].target}):")
        lines += [f"#     {command}" for command in commands]
    return lines
