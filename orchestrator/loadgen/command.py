"""`orchestrator bench cluster.toml`: measure the running cluster through its gateway.

    state file ─▶ orchestrator alive? ─▶ gateway /health ready? (else refuse, saying why)
      ─▶ one warm-up request ─▶ N streams at once, M tokens each, over a prompt of P
         tokens (a bar counts the tokens) ─▶ TTFT, inter-token p50/p99, aggregate
         tokens/s, errors: a table, or --json

With `[[instances]]` each distinct model id is measured in turn (one table each, --json a
list), or only `--model ID` (an id or alias, sent as the request's model).

Exit 0 when every stream finished, 1 when any failed, 2 when the cluster is not ready.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.config import ClusterSpec, check_cluster_file
from orchestrator.config.instances import instance_specs
from orchestrator.console import report_console
from orchestrator.loadgen.readiness import Gateway, NotReady, ready_gateway
from orchestrator.loadgen.report import BenchReport, build_report, report_table
from orchestrator.loadgen.streams import chat_body, concurrent_streams, stream_chat

EXIT_OK, EXIT_ERRORS, EXIT_NOT_READY = 0, 1, 2
# Common one-token words: a prompt of P of them is about P tokens for the tokenizers of
# the models we serve; the server's own count is reported next to the asked length.
FILLER = ("the", "sea", "was", "calm", "and", "the", "light", "kept", "on", "turning", "while",
          "the", "keeper", "wrote", "down", "every", "ship", "that", "passed", "at", "night")
ASK = "Then write a long story about the lighthouse keeper."


@dataclass(frozen=True)
class BenchOptions:
    streams: int = 4
    max_tokens: int = 128
    prompt_tokens: int = 64
    warmup: bool = True
    timeout_s: float = 600.0


def prompt_text(tokens: int, serial: int) -> str:
    """About `tokens` tokens, different from the first word on for every serial, so no
    stream is served from another's prefix cache."""
    words = [f"[{serial}]"] + [FILLER[i % len(FILLER)] for i in range(max(0, tokens - 12))]
    return " ".join(words) + ". " + ASK


def bench(config: Path, options: BenchOptions, as_json: bool, model: str | None = None) -> int:
    """`model`: the id or alias to send; None: the file's model, or with [[instances]]
    each distinct instance id in turn (one report each; --json: a list)."""
    spec, _warnings = check_cluster_file(config)
    target = ready_gateway(spec)
    if isinstance(target, NotReady):
        if as_json:
            print(json.dumps({"cluster": spec.cluster.name, "state": target.state,
                              "reason": target.reason}))
        else:
            print(target.reason, file=sys.stderr)
        return EXIT_NOT_READY
    models = [model] if model else served_ids(spec)
    reports = [_measure(spec.cluster.name, target, one, options, as_json) for one in models]
    if as_json:
        shown = [report.as_dict() for report in reports]
        print(json.dumps(shown if len(models) > 1 else shown[0], indent=2))
    else:
        console = report_console()
        for report in reports:
            console.print(report_table(report))
            for message in report.error_messages:
                console.print(f"[red]error:[/] {message}", highlight=False)
    return EXIT_ERRORS if any(report.errors for report in reports) else EXIT_OK


def served_ids(spec: ClusterSpec) -> list[str]:
    """The ids bench sends by default: the file's model, or each instance's (replicas of
    one id once: the gateway balances them)."""
    return list(dict.fromkeys(one.model.served_id for one in instance_specs(spec).values()))


def _measure(cluster: str, target: Gateway, model: str, options: BenchOptions,
             quiet: bool) -> BenchReport:
    if options.warmup:  # loads what a first request loads; not counted
        with httpx.Client(timeout=options.timeout_s, headers=target.headers) as client:
            stream_chat(client, target.url, chat_body(model, "Hello", 1))
    bodies = [chat_body(model, prompt_text(options.prompt_tokens, i), options.max_tokens,
                        usage=True) for i in range(options.streams)]
    with _progress(quiet) as progress:
        task = progress.add_task(f"tokens ({model})", total=options.streams * options.max_tokens)
        times, wall = concurrent_streams(
            target.url, bodies, headers=target.headers, timeout_s=options.timeout_s,
            on_token=lambda _stream: progress.advance(task),
        )
    return build_report(times, wall, cluster=cluster, url=target.url, model=model,
                        max_tokens=options.max_tokens, prompt_tokens=options.prompt_tokens)


def _progress(quiet: bool) -> Progress:
    """Tokens received out of those asked for, on stderr (stdout keeps the table or JSON)."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), disable=quiet, transient=True,
    )
