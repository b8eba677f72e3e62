"""Benchmark: `pull` from a local hub (testkit.hub_server, HF_ENDPOINT) vs plain curl of the
same files, and what a resumed pull fetches again.

1. pull into an empty cache (the real huggingface_hub client through orchestrator.models
   .pull, 8 files at once, each hash-checked), --runs times, the median wall time;
2. curl of the same resolve URLs into an empty directory: one `curl --parallel` process
   (8 at once, as pull), and one curl after the other; no hash checks;
3. resume: the weights' GET is cut halfway (then the hub refuses, so the pull gives up),
   and the next pull's bytes are counted at the server.

    .venv/bin/python bench/hub_pull.py [--runs 5] [--model bundled:smollm2-135m-instruct|DIR]

Figures go to bench/results/hub-pull-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.model_ref import Bundled, parse_model_ref  # noqa: E402
from contract.settings import ModelSettings  # noqa: E402
from orchestrator.models.hub import HubAccess, HubError  # noqa: E402
from orchestrator.models.pull import PullProgress, pull  # noqa: E402
from serving.model.bundled import default_cache_dir, resolve_model  # noqa: E402
from testkit.hub_server import HubServer, ServedRepo, serve_dir  # noqa: E402

HUB_ID = "mlx-community/bench-model"


def _pull_once(hub: HubServer, store: Path) -> float:
    shutil.rmtree(store, ignore_errors=True)
    started = time.monotonic()
    pull(ModelSettings(path=f"hf:{HUB_ID}", store=str(store)), PullProgress(), _access(hub))
    return time.monotonic() - started


def _curl_once(
    hub: HubServer, files: list[str], out: Path, commit: str, parallel: bool, verify: bool = False
) -> float:
    """curl of every file; `verify`: then sha256sum of them all (what pull checks)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = ["curl", "-sf"] + (["--parallel", "--parallel-max", "8"] if parallel else [])
    for i, name in enumerate(files):
        argv += ["-o", str(out / str(i)), f"{hub.url}/{HUB_ID}/resolve/{commit}/{name}"]
    started = time.monotonic()
    subprocess.run(argv, check=True)
    if verify:
        subprocess.run(["sha256sum", *map(str, out.iterdir())], check=True, capture_output=True)
    return time.monotonic() - started


def _access(hub: HubServer) -> HubAccess:
    return HubAccess(hub.url, None, False)


def _resume(hub: HubServer, repo: ServedRepo, store: Path) -> dict[str, int]:
    """The weights' GET cut halfway (the hub then refuses, so that pull gives up); the next
    pull's bytes, counted at the hub."""
    shutil.rmtree(store, ignore_errors=True)
    model = ModelSettings(path=f"hf:{HUB_ID}", store=str(store))
    weights = max(repo.files.values(), key=lambda f: f.size)
    hub.sent.clear()
    hub.faults.cut_after[weights.path] = weights.size // 2
    hub.faults.refuse_after_cut = 10
    with contextlib.suppress(HubError):
        pull(model, PullProgress(), _access(hub))
    hub.faults.refuse_after_cut = 0
    first = hub.sent[weights.path]
    hub.sent.clear()
    report = pull(model, PullProgress(), _access(hub))
    return {
        "file_bytes": weights.size,
        "sent_before_cut": first,
        "kept": report.resumed_bytes,
        "resent": first - report.resumed_bytes,
        "second_pull_bytes": hub.sent[weights.path],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    args = parser.parse_args()
    source = (
        resolve_model(args.model, default_cache_dir())
        if isinstance(parse_model_ref(args.model), Bundled)
        else Path(args.model)
    )
    repo = serve_dir(HUB_ID, source)
    total = sum(f.size for f in repo.files.values())
    names = list(repo.files)
    results: dict[str, Any] = {"model": args.model, "files": len(names), "bytes": total}
    with tempfile.TemporaryDirectory() as tmp, HubServer([repo]) as hub:
        root = Path(tmp)
        timings = {
            "pull": [_pull_once(hub, root / "store") for _ in range(args.runs)],
            "curl_parallel": [
                _curl_once(hub, names, root / "curl", repo.commit, True) for _ in range(args.runs)
            ],
            "curl_parallel_then_sha256sum": [
                _curl_once(hub, names, root / "curl", repo.commit, True, True)
                for _ in range(args.runs)
            ],
            "curl_sequential": [
                _curl_once(hub, names, root / "curl", repo.commit, False) for _ in range(args.runs)
            ],
        }
        for name, seconds in timings.items():
            median = statistics.median(seconds)
            results[name] = {
                "median_s": round(median, 3),
                "mb_per_s": round(total / median / 1e6, 1),
            }

        results["resume"] = _resume(hub, repo, root / "store")
    ratio = results["pull"]["mb_per_s"] / results["curl_parallel"]["mb_per_s"]
    results["pull_vs_curl_parallel"] = round(ratio, 2)
    print(json.dumps(results, indent=2))
    results_path("hub-pull").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
