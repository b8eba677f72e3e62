"""Benchmark: speculative decoding (prompt lookup, draft model) on vs off, side by side.

For each rank count, our ranks are started with `[serving] speculative = "off"`, with
"prompt_lookup" and with "draft" (--draft-model: the bundled model in 4-bit by default,
drafting for the target as served), all up at once with requests interleaved, and run
the same single-stream workloads: a code edit (a file to repeat with one change: what
prompt lookup is for) and two open-ended chats (where it rarely finds a match). Per
workload: TTFT, decode tokens/s ((completion tokens - 1) / first-to-last chunk), the
acceptance rate (accepted / drafted tokens, from /metrics) and, against `off`, the median
and range of the per-repetition ratios.
At 2 ranks a model whose KV heads do not split in 2 (SmolLM2) runs as a pipeline.
Figures go to bench/results/speculative-<timestamp>.json and a table is printed.

    flock /tmp/mlxco-e2e.lock .venv/bin/python bench/speculative.py --ranks 1 2
    flock /tmp/mlxco-e2e.lock .venv/bin/python bench/speculative.py --ranks 1 --modes off draft
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from orchestrator.loadgen.streams import chat_body, stream_chat  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402
from testkit.waiting import metric_value  # noqa: E402

FILE = '''import json
from pathlib import Path


def load_config(path: Path) -> dict:
    """Read the JSON config at path."""
    with path.open() as handle:
        return json.load(handle)


def save_config(path: Path, config: dict) -> None:
    """Write config to path as JSON."""
    with path.open("w") as handle:
        json.dump(config, handle, indent=2)


def merge(base: dict, override: dict) -> dict:
    """Merge override into base, one level deep."""
    result = dict(base)
    for key, value in override.items():
        result[key] = value
    return result
'''
WORKLOADS = {
    "code_edit": "Here is a Python file:\n\n" + FILE + "\nRewrite the whole file, with the "
    "function `merge` renamed to `merged`. Reply with the code only.",
    "chat": "Write a long, detailed story about a lighthouse keeper and a storm.",
    "chat_explain": "Explain how a refrigerator works, in detail, for a curious teenager.",
}
MODES = ("off", "prompt_lookup", "draft")


@dataclass
class Figures:
    ranks: int
    layout: str  # "tensor" | "pipeline"
    mode: str
    workload: str
    ttft_s: list[float] = field(default_factory=list)
    tok_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    drafted: float = 0.0
    accepted: float = 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def layout_for(model_dir: Path, ranks: int) -> list[int] | None:
    """A pipeline split when the KV heads do not divide among the ranks, else tensor."""
    config = json.loads((model_dir / "config.json").read_text())
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    if ranks == 1 or heads % ranks == 0:
        return None
    layers = int(config["num_hidden_layers"])
    return [layers // ranks + (r < layers % ranks) for r in range(ranks)]


def one_stream(url: str, text: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT, decode tokens/s, completion tokens) of one greedy streamed chat."""
    with httpx.Client(timeout=1800) as client:
        times = stream_chat(client, url, chat_body("m", text, max_tokens, usage=True))
    if times.error or not times.arrivals:
        raise RuntimeError(f"stream failed: {times.error or 'no content'}")
    span = times.arrivals[-1] - times.arrivals[0]
    rate = (times.tokens - 1) / span if span > 0 else float("nan")
    return times.arrivals[0] - times.started, rate, times.tokens


def launch(stack: contextlib.ExitStack, model_dir: Path, ranks: int, mode: str,
           args: argparse.Namespace) -> str:
    """Start our ranks in `mode` (kept up until the stack closes); their base URL."""
    split = layout_for(model_dir, ranks)
    draft = {"draft_model": str(args.draft_dir)} if mode == "draft" else {}
    cluster = stack.enter_context(rank_cluster(
        args.workdir / f"{mode}-{ranks}", model_dir, ranks, served_model_id="m",
        pipeline_split=split, speculative=mode, num_draft_tokens=args.draft_tokens,
        **draft))  # type: ignore[arg-type]
    one_stream(cluster.base_url, "Say hello.", 8)  # warm-up
    return cluster.base_url


def bench_ranks(model_dir: Path, ranks: int, args: argparse.Namespace) -> list[Figures]:
    """Every mode's ranks up at once (idle ones cost nothing), requests interleaved:
    each repetition runs a workload on every mode in turn (the order alternating), so
    the machine's load of the moment weighs on all modes alike."""
    layout = "pipeline" if layout_for(model_dir, ranks) else "tensor"
    figures = {(m, w): Figures(ranks, layout, m, w) for m in args.modes for w in WORKLOADS}
    with contextlib.ExitStack() as stack:
        urls = {mode: launch(stack, model_dir, ranks, mode, args) for mode in args.modes}
        for rep in range(args.repeats):
            for workload in WORKLOADS:
                for mode in args.modes if rep % 2 == 0 else args.modes[::-1]:
                    fig, url = figures[(mode, workload)], urls[mode]
                    drafted = metric_value(url, "serving_spec_draft_tokens_total")
                    accepted = metric_value(url, "serving_spec_accepted_tokens_total")
                    ttft, rate, tokens = one_stream(url, WORKLOADS[workload], args.max_tokens)
                    fig.drafted += metric_value(url, "serving_spec_draft_tokens_total") - drafted
                    fig.accepted += (metric_value(url, "serving_spec_accepted_tokens_total")
                                     - accepted)
                    fig.ttft_s.append(ttft)
                    fig.tok_s.append(rate)
                    fig.tokens.append(tokens)
                    print(f"  {ranks}r {layout} {mode} {workload} #{rep}: ttft {ttft:.2f} s, "
                          f"{rate:.2f} tok/s, {tokens} tokens", flush=True)
    return list(figures.values())


def print_table(figures: list[Figures]) -> None:
    """Medians; `x off` is the median of the per-repetition ratios (each paired with the
    off run next to it), with their range."""
    print(f"\n{'ranks':>5} {'layout':8} {'workload':12} {'mode':14} {'TTFT s':>7} "
          f"{'tok/s':>7} {'x off':>6} {'range':>11} {'accept':>7}")
    base = {(f.ranks, f.workload): f.tok_s for f in figures if f.mode == "off"}
    for f in sorted(figures, key=lambda f: (f.ranks, f.workload, f.mode)):
        off = base.get((f.ranks, f.workload))
        ratios = [a / b for a, b in zip(f.tok_s, off, strict=True)] if off else []
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
        shown = "-" if f.acceptance is None else f"{f.acceptance:.0%}"
        print(f"{f.ranks:>5} {f.layout:8} {f.workload:12} {f.mode:14} "
              f"{statistics.median(f.ttft_s):>7.2f} {statistics.median(f.tok_s):>7.2f} "
              f"{ratio:>6} {spread:>11} {shown:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--draft-model", default="bundled:smollm2-135m-instruct",
                        help="for mode draft; bundled: models in 4-bit")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/speculative-bench"))
    args = parser.parse_args()
    model_dir = resolve(RankSettings(model=ModelSettings(path=args.model)),
                        float32=find_openblas() is not None)  # as the ranks serve it
    args.draft_dir = resolve(RankSettings(model=ModelSettings(path=args.draft_model)))
    figures: list[Figures] = []
    for ranks in args.ranks:
        figures.extend(bench_ranks(model_dir, ranks, args))
    print_table(figures)
    out = results_path("speculative")
    meta = {"model": args.model, "max_tokens": args.max_tokens, "repeats": args.repeats,
            "draft_tokens": args.draft_tokens, "draft_model": args.draft_model,
            "cpu_count": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "figures": [asdict(f) for f in figures]},
                              indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
