"""`orchestrator` command line: parses arguments and hands off to one module per command."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as metadata
import logging
import os
import platform
import sys
from pathlib import Path

from orchestrator.config import ConfigErrors, check_cluster_file
from orchestrator.config.api_auth import unset_key_issue
from orchestrator.config.issues import ConfigIssue
from orchestrator.config.summary import summarize
from orchestrator.status import control

EXIT_OK = 0
EXIT_CONFIG = 2
DEFAULT_CONFIG = Path("cluster.toml")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    try:
        return int(args.run(args))
    except ConfigErrors as errors:
        print(errors, file=sys.stderr)
        return EXIT_CONFIG


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Run one LLM across several Macs with MLX (tensor or pipeline), supervised.",
    )
    versions_help = "print the versions of this program, mlx, mlx-lm and Python"
    parser.add_argument("--version", action=_Version, nargs=0, help=versions_help)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(
        name: str, help: str, run: object, config_optional: bool = False
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        if config_optional:
            sub.add_argument(
                "config",
                type=Path,
                nargs="?",
                default=DEFAULT_CONFIG,
                help="path of cluster.toml (default: ./cluster.toml)",
            )
        else:
            sub.add_argument("config", type=Path, help="path of cluster.toml")
        sub.set_defaults(run=run)
        return sub

    command("validate", "check a cluster.toml and summarize it", _validate)
    plan_help = ("probe the nodes (--offline: none) and print the launch plan (placement, "
                 "ranks, ports, env)")
    _offline_options(command("plan", plan_help, _plan), "--json",
                     "the plan as JSON (TOML without it)")
    up = command("up", "connect, preflight, launch and supervise the cluster; serve its API", _up)
    _offline_options(up, "--dry-run", "print the launch plan and stop")
    status = command(
        "status", "show the running cluster at a glance", _status, config_optional=True
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    down_help = "stop the running cluster; no process of it is left"
    command("down", down_help, _down, config_optional=True).add_argument(
        "--keep-ranks", action="store_true", help=KEEP_RANKS_HELP
    )
    _linktest_options(command("linktest", LINKTEST_HELP, _linktest))
    restart_help = "reset the restart budget and relaunch a failed cluster"
    command("restart", restart_help, _restart, config_optional=True)
    _bootstrap_options(command("bootstrap", BOOTSTRAP_HELP, _bootstrap))
    _bench_options(command("bench", BENCH_HELP, _bench, config_optional=True))
    sync_help = "copy the model (each instance's) to the nodes serving it that lack it"
    _sync_options(command("sync", sync_help, _sync))
    pull_help = "download each hf: model once to this machine (resumes, verifies)"
    models_help = "the models at this machine and the cluster's own"
    models = command("models", models_help, _models, True)
    for sub in (command("pull", pull_help, _pull), models):
        sub.add_argument("--json", action="store_true", help="machine-readable, no progress")
    _fit_options(models)
    from orchestrator.init.command import add_init_command
    from orchestrator.service.command import add_service_command  # light: no serving stack

    add_service_command(commands)
    add_init_command(commands)
    return parser


LINKTEST_HELP = (
    "measure the links between the nodes (correctness, latency, all_sum bandwidth, and "
    "GB/s of each ring link rank i -> i+1; a mesh's other pairs are not measured)"
)
KEEP_RANKS_HELP = (
    "only the orchestrator exits (to upgrade it): the ranks serve on for [supervisor] "
    "orphan_grace_s, and the next `up` adopts them with no model load"
)


class _Version(argparse.Action):
    """Reads the versions only when asked: no start-up cost for every other command."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(versions())
        parser.exit()


def versions() -> str:
    """e.g. "mlx-cluster-orchestrator 0.1.0 (mlx 0.32.4, mlx-lm 0.32.2, Python 3.11.7)"."""

    def of(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    tools = f"mlx {of('mlx')}, mlx-lm {of('mlx-lm')}, Python {platform.python_version()}"
    return f"mlx-cluster-orchestrator {of('mlx-cluster-orchestrator')} ({tools})"


def _validate(args: argparse.Namespace) -> int:
    spec, warnings = check_cluster_file(args.config)
    print(summarize(spec, warnings, args.config))
    return EXIT_OK


OFFLINE_HELP = (
    "connect to nothing: each node's memory is its memory_gb (or --memory-gb), a local "
    "node's is measured here; an hf: model not pulled is read from the hub's config.json"
)


def _offline_options(sub: argparse.ArgumentParser, flag: str, flag_help: str) -> None:
    sub.add_argument(flag, action="store_true", help=flag_help)
    sub.add_argument("--offline", action="store_true", help=OFFLINE_HELP)
    _memory_option(sub)


def _memory_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--memory-gb", type=_node_memory, action="append", default=[], metavar="NODE=GB",
        help="as if [[nodes]] memory_gb of NODE were GB (repeatable)",
    )


def _node_memory(text: str) -> tuple[str, float]:
    node, _, value = text.partition("=")
    try:
        gb = float(value)
    except ValueError:
        gb = 0.0
    if not node or not gb > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE=GB (e.g. studio-b=190)")
    return node, gb


def _plan(args: argparse.Namespace) -> int:
    spec, _warnings = check_cluster_file(args.config)
    if args.offline:
        from orchestrator.launch.plan_command import print_offline_plan

        return print_offline_plan(spec, args.config, getattr(args, "json", False),
                                  dict(args.memory_gb))
    from orchestrator.launch.plan_command import print_plan  # connects to the nodes
    from orchestrator.models.commands import located_or_exit
    from orchestrator.placement.stand_in import UnknownNodeName, with_memory

    try:
        spec = with_memory(spec, dict(args.memory_gb))
    except UnknownNodeName as exc:
        raise ConfigErrors(args.config, [ConfigIssue("nodes", str(exc))]) from None
    located = located_or_exit(spec, args.config, pull_first=False)
    if isinstance(located, int):
        return located
    return print_plan(located, as_json=getattr(args, "json", False))


def _up(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _plan(args)
    if args.offline or args.memory_gb:
        print("up: --offline and --memory-gb only plan: add --dry-run", file=sys.stderr)
        return EXIT_CONFIG
    from orchestrator.up import Service  # imports the serving stack; not needed above

    spec, warnings = check_cluster_file(args.config)
    if (refusal := unset_key_issue(spec, os.environ)) is not None:
        raise ConfigErrors(args.config, [refusal])
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health poll otherwise
    for warning in warnings:
        logging.getLogger("orchestrator").warning("%s", warning.render(args.config))
    from orchestrator.models.commands import located_or_exit

    located = located_or_exit(spec, args.config, pull_first=spec.model.sync)
    if isinstance(located, int):
        return located
    return asyncio.run(Service(located, args.config).run())


def _linktest(args: argparse.Namespace) -> int:
    from orchestrator.linktest import linktest

    spec, _warnings = check_cluster_file(args.config)
    return linktest(
        spec,
        force=args.force,
        min_gbps=args.min_gbps,
        as_json=args.json,
        timeout_s=args.timeout_s,
    )


def _linktest_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_argument(
        "--min-gbps", type=float, default=0.0, help="fail when a link is slower (Gbit/s)"
    )
    sub.add_argument("--force", action="store_true", help="run even while the cluster is serving")
    sub.add_argument(
        "--timeout-s", type=float, default=120.0,
        help="seconds before the ranks end an unfinished test as failed (default: 120)",
    )


def _sync_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from", dest="source", metavar="NODE", help="copy from this node's copy")
    sub.add_argument("--json", action="store_true", help="no progress; print a JSON summary")


def _sync(args: argparse.Namespace) -> int:
    from contract.model_ref import Hub, parse_model_ref
    from orchestrator.provision.sync.command import sync_command

    spec, _warnings = check_cluster_file(args.config)
    served = [instance.model for instance in spec.instances] or [spec.model.path]
    # the hub's client only for a hub model: 0.2 s of imports
    if any(isinstance(parse_model_ref(path), Hub) for path in served):
        from orchestrator.models.commands import located_or_exit

        located = located_or_exit(spec, args.config, pull_first=False)
        if isinstance(located, int):
            return located
        spec = located
    return sync_command(spec, args.config, args.source, args.json)


def _pull(args: argparse.Namespace) -> int:
    from orchestrator.models.commands import pull_command

    spec, _warnings = check_cluster_file(args.config)
    return pull_command(spec, args.config, args.json)


def _fit_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--fit", action="store_true",
                     help="whether each MODEL (else the cluster's) fits this cluster, read "
                     "from its config.json: no weights downloaded")
    sub.add_argument("model", nargs="*", metavar="MODEL",
                     help="with --fit: hf:ORG/NAME[@REV] or a model directory here")
    _memory_option(sub)


def _models(args: argparse.Namespace) -> int:
    given = args.config != DEFAULT_CONFIG or args.config.exists()
    if args.fit or args.model or args.memory_gb:
        if not args.fit:
            print("models: MODEL and --memory-gb go with --fit", file=sys.stderr)
            return EXIT_CONFIG
        from orchestrator.models.fit_command import fit_command

        cluster = check_cluster_file(args.config)[0]
        return fit_command(cluster, args.config, args.model, args.json, dict(args.memory_gb))
    from orchestrator.models.catalog import models_command

    spec = check_cluster_file(args.config)[0] if given else None
    return models_command(spec, args.json)


BOOTSTRAP_HELP = "make each node's venv hold this machine's versions (offline nodes too)"


def _bootstrap_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--dry-run", action="store_true", help="probe and plan; change nothing")
    sub.add_argument("--node", action="append", help="only this node (repeatable)")
    sub.add_argument("--wheel-cache", help="this machine's wheel cache directory")


def _bootstrap(args: argparse.Namespace) -> int:
    from orchestrator.provision.bootstrap.command import bootstrap

    spec, _warnings = check_cluster_file(args.config)
    return bootstrap(spec, dry_run=args.dry_run, wheel_cache=args.wheel_cache, only=args.node)


BENCH_HELP = "measure the running cluster through its gateway: TTFT, inter-token, tokens/s"


def _bench_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--streams", type=_positive, default=4, help="concurrent streams (4)")
    sub.add_argument("--tokens", type=_positive, default=128, help="max_tokens of each (128)")
    sub.add_argument("--prompt-tokens", type=_positive, default=64,
                     help="about how long each prompt is, in tokens (64)")
    sub.add_argument("--no-warmup", action="store_true", help="skip the uncounted first request")
    sub.add_argument("--model", metavar="ID", help="the model id or alias to send (default: "
                     "the model; with [[instances]], each instance's id in turn)")
    sub.add_argument("--json", action="store_true", help="no progress; print the figures as JSON")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of at least 1")
    return value


def _bench(args: argparse.Namespace) -> int:
    from orchestrator.loadgen.command import BenchOptions, bench

    options = BenchOptions(streams=args.streams, max_tokens=args.tokens,
                           prompt_tokens=args.prompt_tokens, warmup=not args.no_warmup)
    return bench(args.config, options, args.json, args.model)


def _status(args: argparse.Namespace) -> int:
    return control.status(args.config, args.json)


def _down(args: argparse.Namespace) -> int:
    return control.down(args.config, keep_ranks=args.keep_ranks)


def _restart(args: argparse.Namespace) -> int:
    return control.restart(args.config)


if __name__ == "__main__":
    sys.exit(main())
