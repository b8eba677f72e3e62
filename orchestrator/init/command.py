"""`orchestrator init HOST... [-o cluster.toml]`: probe the hosts, find their cables, write
a cluster.toml that validates. It changes nothing on any host: what a host lacks (a
cable's address, a port in the Thunderbolt Bridge) is printed as commands to run.

    HOST ("me@studio-b.local", "10.1.0.11", "local") ──transport──▶ probe.py (its tools)
        ──▶ cables.py ──▶ layout.py (order, backend, addresses) ──▶ render.py ──▶ validated
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import re
import socket
import sys
import tomllib
from pathlib import Path

from orchestrator.config import ConfigErrors, NodeSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.init.layout import InitError, plan_layout
from orchestrator.init.probe import HostProbe, probe_host
from orchestrator.init.render import Access, render
from orchestrator.transports import Completed, transport_for

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
COMMAND_TIMEOUT_S = 60.0  # system_profiler on a Mac takes a few seconds
HELP = "probe hosts over SSH, find the cables between them, write a cluster.toml"


def add_init_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = commands.add_parser("init", help=HELP, description=HELP + " (changes no host)")
    sub.add_argument("hosts", nargs="+", metavar="HOST",
                     help='"[user@]host" reached over SSH, or "local" for this machine')
    sub.add_argument("-o", "--output", type=Path,
                     help="write the file here (default: print it)")
    sub.add_argument("--force", action="store_true", help="overwrite an existing --output")
    sub.add_argument("--identity-file", help="SSH private key for every host")
    sub.add_argument("--known-hosts", help="known_hosts file to check the hosts' keys with")
    sub.add_argument("--accept-new-host-keys", action="store_true",
                     help="trust a host key seen for the first time (and write so)")
    sub.add_argument("--python", help="the nodes' Python (default: python3 to probe; the "
                     "file then uses a [bootstrap] venv)")
    sub.add_argument("--name", default="mlx-cluster", help="the cluster's name")
    sub.add_argument("--model", help="[model] path (default: the bundled demo model)")
    sub.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.output and args.output.exists() and not args.force:
        print(f"{args.output} exists: pass --force to overwrite it", file=sys.stderr)
        return EXIT_USAGE
    if args.hosts.count("local") > 1:
        print("`local` may be given once", file=sys.stderr)
        return EXIT_USAGE
    access = Access(args.identity_file, args.known_hosts, args.python, args.accept_new_host_keys)
    names = node_names(args.hosts)
    try:
        hosts = asyncio.run(probe_all(args.hosts, names, access))
        layout = plan_layout(hosts, names)
    except InitError as exc:
        print(f"init: {exc}", file=sys.stderr)
        return EXIT_FAILED
    text = render(hosts, names, layout, access, args.name, args.model)
    try:
        check_cluster_data(tomllib.loads(text), args.output or Path("cluster.toml"))
    except ConfigErrors as errors:  # a host set-up init does not handle yet: say so
        print(text, f"init wrote a file that does not validate:\n{errors}", file=sys.stderr)
        return EXIT_FAILED
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    for index, commands in layout.commands.items():
        print(f"\non {names[index]} ({args.hosts[index]}), before `up`:", file=sys.stderr)
        print("\n".join(f"  {c}" for c in commands), file=sys.stderr)
    return EXIT_OK


def node_names(targets: list[str]) -> list[str]:
    """A node name per host: its host name without a domain ("studio-a" for
    me@studio-a.local), this machine's for `local`, node<N> for an address."""
    names: list[str] = []
    for number, target in enumerate(targets, start=1):
        host = socket.gethostname() if target == "local" else target.rpartition("@")[2]
        host = host.strip("[]")
        try:
            ipaddress.ip_address(host)
            name = f"node{number}"
        except ValueError:
            name = re.sub(r"[^A-Za-z0-9_-]", "-", host.split(".")[0]).strip("-") or \
                f"node{number}"
        while name in names:
            name += "-2"
        names.append(name)
    return names


async def probe_all(targets: list[str], names: list[str], access: Access) -> list[HostProbe]:
    """Every host at once; every one that cannot be reached is reported, not just the first."""
    results = await asyncio.gather(
        *(_probe(t, n, access) for t, n in zip(targets, names, strict=True)),
        return_exceptions=True,
    )
    failed = [f"{t}: {r}" for t, r in zip(targets, results, strict=True)
              if isinstance(r, BaseException)]
    if failed:
        raise InitError("cannot probe " + "; ".join(failed))
    return [r for r in results if isinstance(r, HostProbe)]


async def _probe(target: str, name: str, access: Access) -> HostProbe:
    local = target == "local"
    node = NodeSpec(
        name=name, transport="local" if local else "ssh", ssh=None if local else target,
        identity_file=access.identity_file, known_hosts=access.known_hosts,
        accept_new_host_keys=access.accept_new_host_keys,
    )
    python = access.python or (sys.executable if local else "python3")
    transport = transport_for(node)
    try:
        await transport.connect()

        async def run_one(_key: str, argv: list[str]) -> Completed:
            return await transport.run(argv, timeout=COMMAND_TIMEOUT_S)

        return await probe_host(target, run_one, python)
    finally:
        await transport.close()
