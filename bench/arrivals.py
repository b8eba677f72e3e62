"""Benchmark: time to first token when requests arrive together, ours vs mlx_lm.server.

For each rank count, each repetition starts our ranks (testkit.rank_cluster: rank 0's API
directly, as bench/serving.py does; the gateway adds ~1 ms, bench/gateway.py) and
`python -m mlx_lm.server` on the same model directory with the same BLAS, both up at
once and idle but for the burst at hand. It fires bursts of 1, 4 and 8 streamed chats at
once (threads released together, one connection each), `--bursts` times per level, each
burst at one server and then the same at the other (who goes first alternates), so a
moment's load on this shared machine weighs on both alike; then one stream's decode
rate on each. Per rank count and level: TTFT p50 of both servers and the ratio ours /
mlx_lm.server (target <= 1.1), the paired ratios burst by burst (median, range, share
<= 1.1), and 1-stream tokens/s (target ratio >= 1.0).
Figures go to bench/results/arrivals-<timestamp>.json.

    .venv/bin/python bench/arrivals.py [--ranks 1] [--levels 1 4 8] [--repeats 3]
    .venv/bin/python bench/arrivals.py --ranks 2 --model medium

The bundled SmolLM2 (9 heads, 3 KV heads) cannot be split over 2 ranks by mlx_lm.server
(tensor only: mlx-lm's Llama has no pipeline), so `--model medium` writes a random-weight
Llama of its shape with 8 heads / 4 KV heads (testkit.tiny_model; float32), which both
servers split over 2 ranks alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from bench.serving import mlx_lm_server  # noqa: E402
from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from orchestrator.loadgen.streams import StreamTimes, chat_body, stream_chat  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402
from testkit.tiny_model import write_tiny_model  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper and a storm."
SERVERS = ("ours", "mlx_lm.server")


@dataclass
class Figures:
    server: str
    ranks: int
    # by burst size: one list of TTFTs per burst, bursts in the order they ran
    bursts: dict[int, list[list[float]]] = field(default_factory=dict)
    decode_tok_s: list[float] = field(default_factory=list)  # one stream


def burst(url: str, model: str, n: int, max_tokens: int, tag: str) -> list[StreamTimes]:
    """n streamed chats released at the same instant, each on its own connection."""
    clients = [httpx.Client(timeout=600) for _ in range(n)]
    for client in clients:  # connect first: the burst measures requests, not handshakes
        client.get(f"{url}/v1/models")
    gate = threading.Barrier(n)
    results: list[StreamTimes | None] = [None] * n

    def one(i: int) -> None:
        body = chat_body(model, f"[{tag}-{i}] {PROMPT}", max_tokens)
        gate.wait()
        results[i] = stream_chat(clients[i], url, body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for client in clients:
        client.close()
    done = [r for r in results if r is not None]
    if failed := [r.error for r in done if r.error] or len(done) < n:
        raise RuntimeError(f"a stream to {url} failed: {failed}")
    return done


@contextlib.contextmanager
def serve(server: str, model_dir: Path, ranks: int, work: Path) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of one server, up until the block ends."""
    if server == "ours":
        with rank_cluster(work, model_dir, ranks, served_model_id="m", max_batch_size=8,
                          keepalive_s=30) as c:
            yield c.base_url, "m"
    else:
        with mlx_lm_server(model_dir, ranks, work) as url:
            yield url, str(model_dir)


def measure_pair(
    servers: dict[str, tuple[str, str]], figs: dict[str, Figures], args: argparse.Namespace,
    rep: int,
) -> None:
    """Both servers up, idle but for the burst at hand: each burst goes to one, then the
    same burst to the other (who goes first alternates), so both meet the same load."""
    for server, (url, model) in servers.items():
        burst(url, model, 2, 4, f"warm{rep}{server}")  # compile, allocate: the first pays
    turn = rep
    for n in args.levels:
        for b in range(args.bursts):
            turn += 1
            for server in SERVERS if turn % 2 == 0 else SERVERS[::-1]:
                url, model = servers[server]
                times = burst(url, model, n, args.max_tokens, f"r{rep}n{n}b{b}")
                figs[server].bursts.setdefault(n, []).append([t.ttft_s or 0.0 for t in times])
                time.sleep(0.2)
        for server, fig in figs.items():
            got = [t for one in fig.bursts[n][-args.bursts:] for t in one]
            print(f"  {server} {fig.ranks}r x{n} #{rep}: TTFT p50 "
                  f"{statistics.median(got):.3f} s (max {max(got):.3f})", flush=True)
    for server in SERVERS if rep % 2 == 0 else SERVERS[::-1]:
        url, model = servers[server]
        (single,) = burst(url, model, 1, args.decode_tokens, f"r{rep}decode")
        if len(single.arrivals) > 2:
            span = single.arrivals[-1] - single.arrivals[0]
            figs[server].decode_tok_s.append((len(single.arrivals) - 1) / span)
            print(f"  {server} {figs[server].ranks}r decode #{rep}: "
                  f"{figs[server].decode_tok_s[-1]:.2f} tok/s", flush=True)


def spread(ratios: list[float]) -> dict[str, float]:
    """Median and range of paired ratios (ours / theirs, burst by burst)."""
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "under_1_1": sum(r <= 1.1 for r in ratios) / len(ratios)}


def summary(figs: dict[str, Figures], levels: list[int]) -> dict[str, object]:
    """Per level: TTFT p50 over every request of both servers and its ratio, and the
    paired ratios (each burst's p50 over the same burst's on the other server); the
    decode rates likewise."""
    ours, theirs = figs[SERVERS[0]], figs[SERVERS[1]]
    out: dict[str, object] = {"ranks": ours.ranks}
    for n in levels:
        a = statistics.median(t for one in ours.bursts[n] for t in one)
        b = statistics.median(t for one in theirs.bursts[n] for t in one)
        paired = [statistics.median(x) / statistics.median(y)
                  for x, y in zip(ours.bursts[n], theirs.bursts[n], strict=True)]
        out[f"ttft_p50_{n}"] = {"ours": a, "mlx_lm": b, "ratio": a / b, "paired": spread(paired)}
    a, b = statistics.median(ours.decode_tok_s), statistics.median(theirs.decode_tok_s)
    paired = [x / y for x, y in zip(ours.decode_tok_s, theirs.decode_tok_s, strict=True)]
    out["decode_tok_s"] = {"ours": a, "mlx_lm": b, "ratio": a / b, "paired": spread(paired)}
    return out


def print_summary(rows: list[dict[str, object]], levels: list[int]) -> None:
    print("\nranks | level | p50 ours / theirs | ratio | paired ratio median [min-max] "
          "(share <= 1.1)")
    for row in rows:
        for key in [f"ttft_p50_{n}" for n in levels] + ["decode_tok_s"]:
            v = row[key]
            assert isinstance(v, dict)
            p = v["paired"]
            print(f"{row['ranks']} | {key} | {v['ours']:.3f} / {v['mlx_lm']:.3f} | "
                  f"{v['ratio']:.2f}x | {p['median']:.2f}x [{p['min']:.2f}-{p['max']:.2f}] "
                  f"({p['under_1_1']:.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct",
                        help="a model spec or directory, or medium (above)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bursts", type=int, default=3, help="bursts per level and repeat")
    parser.add_argument("--max-tokens", type=int, default=8, help="per request of a burst")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/arrivals-bench"))
    args = parser.parse_args()
    if args.model == "medium":  # SmolLM2's shape with heads that split over 2 ranks
        model_dir = write_tiny_model(args.workdir / "medium", num_layers=30, hidden_size=576)
    else:
        model_dir = resolve(RankSettings(model=ModelSettings(path=args.model)),
                            float32=find_openblas() is not None)  # as the ranks serve it
    figures: list[Figures] = []
    rows = []
    for ranks in args.ranks:
        figs = {s: Figures(s, ranks) for s in SERVERS}
        for rep in range(args.repeats):
            with contextlib.ExitStack() as stack:
                servers = {s: stack.enter_context(serve(
                    s, model_dir, ranks, args.workdir / f"{s}-{ranks}r-{rep}")) for s in SERVERS}
                measure_pair(servers, figs, args, rep)
        figures.extend(figs.values())
        rows.append(summary(figs, args.levels))
    print_summary(rows, args.levels)
    out = results_path("arrivals")
    meta = {"model": args.model, "model_dir": str(model_dir), "blas": find_openblas(),
            "cpu_count": os.cpu_count(), **{k: v for k, v in vars(args).items()
                                            if k not in ("model", "workdir")}}
    out.write_text(json.dumps({"meta": meta, "summary": rows,
                               "figures": [asdict(f) for f in figures]}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
