"""What one `orchestrator bench` run measured: figures from the streams' times, as a table
or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rich.table import Table

from orchestrator.loadgen.streams import StreamTimes, percentile


@dataclass
class Spread:
    p50: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            return cls()
        return cls(percentile(values, 0.5), percentile(values, 0.99), max(values))


@dataclass
class BenchReport:
    cluster: str
    url: str
    model: str
    streams: int
    max_tokens: int
    prompt_tokens_asked: int
    prompt_tokens: int | None  # as the server counted them (the first stream's)
    wall_s: float
    tokens: int  # generated, all streams
    tokens_per_s: float  # aggregate: all tokens over the wall time, first send to last end
    stream_tokens_per_s: Spread  # each stream's own decode rate, after its first token
    ttft_s: Spread
    inter_token_s: Spread
    errors: int
    error_messages: list[str] = field(default_factory=list)  # the first few, distinct

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def build_report(
    times: list[StreamTimes], wall_s: float, *, cluster: str, url: str, model: str,
    max_tokens: int, prompt_tokens: int,
) -> BenchReport:
    done = [t for t in times if not t.error]
    tokens = sum(t.tokens for t in done)
    rates = [(len(t.arrivals) - 1) / (t.arrivals[-1] - t.arrivals[0])
             for t in done if len(t.arrivals) > 2 and t.arrivals[-1] > t.arrivals[0]]
    messages = list(dict.fromkeys(t.error for t in times if t.error))[:5]
    counted = [t.prompt_tokens for t in done if t.prompt_tokens is not None]
    return BenchReport(
        cluster=cluster, url=url, model=model, streams=len(times), max_tokens=max_tokens,
        prompt_tokens_asked=prompt_tokens, prompt_tokens=counted[0] if counted else None,
        wall_s=wall_s, tokens=tokens, tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        stream_tokens_per_s=Spread.of(rates),
        ttft_s=Spread.of([t.ttft_s for t in done if t.ttft_s is not None]),
        inter_token_s=Spread.of([gap for t in done for gap in t.gaps_s]),
        errors=len(times) - len(done), error_messages=messages,
    )


def report_table(report: BenchReport) -> Table:
    table = Table(
        title=f"{report.cluster}: {report.streams} streams x {report.max_tokens} tokens, "
        f"prompt {report.prompt_tokens or report.prompt_tokens_asked} tokens, {report.model}",
        title_justify="left",
    )
    for column in ("", "p50", "p99", "max"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row("TTFT", *_ms(report.ttft_s))
    table.add_row("inter-token", *_ms(report.inter_token_s))
    per_stream = report.stream_tokens_per_s
    table.add_row("stream tokens/s", *(f"{v:.1f}" if v is not None else "-"
                                        for v in (per_stream.p50, per_stream.p99, per_stream.max)))
    table.add_section()
    table.add_row("aggregate", f"{report.tokens_per_s:.1f} tokens/s",
                  f"{report.tokens} tokens", f"{report.wall_s:.1f} s")
    errors = f"[red]{report.errors}[/]" if report.errors else "0"
    table.add_row("errors", errors, "", "")
    return table


def _ms(spread: Spread) -> tuple[str, str, str]:
    values = (spread.p50, spread.p99, spread.max)
    return tuple(f"{1000 * v:.1f} ms" if v is not None else "-" for v in values)  # type: ignore[return-value]
