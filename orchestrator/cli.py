"""`orchestrator` command line: parses arguments and hands off to one module per command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.config_check import ConfigErrors, check_cluster_file
from orchestrator.config_summary import summarize

EXIT_OK = 0
EXIT_CONFIG = 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    return int(args.run(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Run one LLM across several Macs with MLX tensor parallelism, supervised.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    validate = commands.add_parser("validate", help="check a cluster.toml and summarize it")
    validate.add_argument("config", type=Path, help="path of cluster.toml")
    validate.set_defaults(run=_validate)
    return parser


def _validate(args: argparse.Namespace) -> int:
    try:
        spec, warnings = check_cluster_file(args.config)
    except ConfigErrors as errors:
        print(errors, file=sys.stderr)
        return EXIT_CONFIG
    print(summarize(spec, warnings, args.config))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
