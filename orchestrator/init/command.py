"""`orchestrator init HOST... [-o cluster.toml] [--apply]`: probe the hosts, find their
cables, write a cluster.toml that validates. Without --apply it changes nothing on any
host: what a host lacks (a cable's address, a port in the Thunderbolt Bridge) is printed
as commands to run. With --apply it runs them (apply.py), probes again, and writes the
file from what the hosts now have.

    HOST ("me@studio-b.local:2222", "10.1.0.11", "local") ──transport──▶ probe.py
        ──▶ cables.py (+ neighbours.py) ──▶ layout.py ──▶ [apply.py, probe again]
        ──▶ render.py ──▶ validated ──▶ written
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

from orchestrator.config import ConfigErrors
from orchestrator.config.load import check_cluster_data
from orchestrator.init.apply import ApplyError, apply_steps
from orchestrator.init.hosts import Connected, connected, probe_all
from orchestrator.init.layout import InitError, Layout, plan_layout
from orchestrator.init.probe import HostProbe
from orchestrator.init.render import Access, render
from orchestrator.init.targets import Target, TargetError, parse_target

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
HELP = "probe hosts over SSH, find the cables between them, write a cluster.toml"


def add_init_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = commands.add_parser("init", help=HELP, description=HELP + " (changes no host "
                              "without --apply)")
    sub.add_argument("hosts", nargs="+", metavar="HOST",
                     help='"[user@]host[:port]" reached over SSH ("user@[v6addr]:port"), '
                     'or "local" for this machine')
    sub.add_argument("-o", "--output", type=Path,
                     help="write the file here (default: print it)")
    sub.add_argument("--force", action="store_true", help="overwrite an existing --output")
    sub.add_argument("--apply", action="store_true",
                     help="run the printed commands on the hosts (cable addresses, "
                     "Thunderbolt Bridge), as root or with passwordless sudo, then probe "
                     "again and write the file")
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
    try:
        targets = [parse_target(text) for text in args.hosts]
    except TargetError as exc:
        print(f"init: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if [t.ssh for t in targets].count("local") > 1:
        print("`local` may be given once", file=sys.stderr)
        return EXIT_USAGE
    access = Access(args.identity_file, args.known_hosts, args.python, args.accept_new_host_keys)
    names = node_names([t.ssh for t in targets])
    try:
        hosts, layout = asyncio.run(_survey(targets, names, access, args.apply))
    except (InitError, ApplyError) as exc:
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
    return EXIT_FAILED if args.apply and layout.steps else EXIT_OK


async def _survey(targets: list[Target], names: list[str], access: Access,
                  apply: bool) -> tuple[list[HostProbe], Layout]:
    """Probe and plan; with apply and something to do: do it, then probe and plan again."""
    async with connected(targets, names, access) as hosts:
        probes = await probe_all(hosts)
        layout = plan_layout(probes, names)
        if not (apply and layout.steps):
            return probes, layout
        await _apply(hosts, names, layout)
        probes = await probe_all(hosts)
        layout = plan_layout(probes, names)
        if layout.steps:
            print("init: after --apply the hosts still lack what the commands below set",
                  file=sys.stderr)
        return probes, layout


async def _apply(hosts: list[Connected], names: list[str], layout: Layout) -> None:
    for index, steps in layout.steps.items():
        ran = await apply_steps(hosts[index].target.ssh, hosts[index].run, steps)
        print(f"applied on {names[index]} ({hosts[index].target.ssh}):", file=sys.stderr)
        print("\n".join(f"  {line}" for line in ran), file=sys.stderr)


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
