"""Benchmark: `orchestrator sync` of a few-hundred-MB model to namespace hosts, vs rsync.

Hosts are network namespaces (testkit.netns), each with a private tmpfs at the model's
directory, reached over SSH on a bridge (no shaping unless said). Measured:

1. hashing the source: the first manifest (every byte read) and a second one (cache);
2. push to 3 empty hosts at once: `orchestrator sync --json` wall time, per-node and
   aggregate MB/s; then `rsync -a --whole-file` over the same sshd to the same 3 hosts at
   once, and both again to 1 host alone;
3. an unchanged model: `sync` again (wall time, bytes hashed on the source and nodes);
4. resume: a sync to 1 host over a link shaped to --resume-rate is SIGKILLed once half of
   the largest file is staged; the next sync's bytes sent vs the whole model;
6. forward_3 (its own ring of 3 hosts, cabled like Thunderbolt): the head's uplink (the
   management bridge, shared by all 3 hosts) shaped to --uplink-rate, each cable to
   --cable-rate; sync from the head alone vs with [model] sync_forwarding (the head sends
   to h0, h1 fetches each file from h0 once h0 verified it, h2 from h1, hops overlapping):
   wall time and the bytes out of the head;
5. pipeline: the bundled model (4-bit) re-split into one shared shard and one shard per
   3 layers, synced to 3 empty hosts with parallel = "pipeline": each host's bytes vs the
   whole model.

    sudo .venv/bin/python bench/model_sync.py [--pad-mb 300] [--runs 2] [--only push_3,pipeline]
        [--profile DIR]   (cProfile of each sync process; push_* also record the CPU seconds
                           of the sync process and of rsync + ssh on this side)

Figures go to bench/results/model-sync-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from node_agent.models.hashes import CACHE_ENV, build_manifest  # noqa: E402
from serving.model.bundled import default_cache_dir, resolve_model  # noqa: E402
from testkit.netns import TC, MultiHost, PrivateTmpfs, multi_host, sh  # noqa: E402
from testkit.orchestrator_process import write_cluster  # noqa: E402
from testkit.sharded_model import write_sharded_copy  # noqa: E402
from testkit.tiny_model import write_tiny_model  # noqa: E402

MB = 1e6
PAD_FILES = 3


def make_model(model: Path, pad_mb: int) -> int:
    """The tiny model plus PAD_FILES random safetensors-named files: total bytes."""
    write_tiny_model(model, model_cache_dir=default_cache_dir())
    per_file = pad_mb * 1_000_000 // PAD_FILES
    for i in range(PAD_FILES):
        with (model / f"pad-{i:05d}.safetensors").open("wb") as f:
            left = per_file
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
    return sum(p.stat().st_size for p in model.rglob("*") if p.is_file())


PROFILE: Path | None = None  # --profile: cProfile of each sync into this directory


def run_sync(config: Path, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    started, cpu = time.monotonic(), _children_cpu()
    prof = []
    if PROFILE is not None:
        prof = ["-m", "cProfile", "-o", str(PROFILE / f"sync-{time.time():.0f}.prof")]
    done = subprocess.run(
        [sys.executable, *prof, "-m", "orchestrator.cli", "sync", str(config), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"sync exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    report = json.loads(done.stdout)
    report["bench_cpu_s"] = round(_children_cpu() - cpu, 2)  # the orchestrator process's
    return seconds, report


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rsync_argv(net: MultiHost, i: int, source: Path, dest: Path) -> list[str]:
    ssh = (
        f"ssh -i {net.user_key} -o UserKnownHostsFile={net.known_hosts} "
        "-o StrictHostKeyChecking=yes -o BatchMode=yes"
    )
    return [
        "rsync",
        "-a",
        "--whole-file",
        "-e",
        ssh,
        f"{source}/",
        f"root@{net.hosts[i].mgmt_ip}:{dest}/",
    ]


def run_rsync(net: MultiHost, hosts: list[int], source: Path, dest: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of rsync and ssh on this side)."""
    started, cpu = time.monotonic(), _children_cpu()
    procs = [subprocess.Popen(rsync_argv(net, i, source, dest)) for i in hosts]
    codes = [p.wait() for p in procs]
    seconds = time.monotonic() - started
    if any(codes):
        raise RuntimeError(f"rsync exited {codes}")
    for i in hosts:
        shutil.rmtree(net.hosts[i].path(dest))
    return seconds, round(_children_cpu() - cpu, 2)


def clear_copies(net: MultiHost, model: Path, hosts: list[int]) -> None:
    for i in hosts:
        for suffix in ("", ".partial-sync"):
            shutil.rmtree(net.hosts[i].path(Path(f"{model}{suffix}")), ignore_errors=True)


def config_for(tmp: Path, net: MultiHost, model: Path, hosts: list[int]) -> Path:
    d = tmp / f"cfg{'-'.join(map(str, hosts))}"
    d.mkdir(exist_ok=True)
    return write_cluster(d, str(model), [net.node(i) for i in hosts])


def hashing(model: Path, cache: Path) -> dict[str, Any]:
    os.environ[CACHE_ENV] = str(cache)
    started = time.monotonic()
    manifest, first = build_manifest(model)
    first_s = time.monotonic() - started
    started = time.monotonic()
    _, again = build_manifest(model)
    again_s = time.monotonic() - started
    return {
        "bytes": manifest.total_bytes,
        "first_s": round(first_s, 3),
        "first_mb_per_s": round(first.hashed_bytes / first_s / MB, 1),
        "again_s": round(again_s, 4),
        "again_hashed_bytes": again.hashed_bytes,
    }


def push(
    tmp: Path, net: MultiHost, model: Path, hosts: list[int], env: dict[str, str], total: int
) -> dict[str, Any]:
    clear_copies(net, model, hosts)
    seconds, report = run_sync(config_for(tmp, net, model, hosts), env)
    assert all(n["status"] == "synced" for n in report["nodes"]), report
    rsync_s, rsync_cpu = run_rsync(net, hosts, model, model.parent / "rsync-copy")
    return {
        "hosts": len(hosts),
        "sync_s": round(seconds, 2),
        "sync_aggregate_mb_per_s": round(total * len(hosts) / seconds / MB, 1),
        "sync_node_mb_per_s": [n["mb_per_s"] for n in report["nodes"]],
        "sync_process_cpu_s": report["bench_cpu_s"],
        "rsync_s": round(rsync_s, 2),
        "rsync_aggregate_mb_per_s": round(total * len(hosts) / rsync_s / MB, 1),
        "rsync_process_cpu_s": rsync_cpu,
        "rsync_s_over_sync_s": round(rsync_s / seconds, 2),  # >= 1: sync at least as fast
    }


def unchanged(tmp: Path, net: MultiHost, model: Path, env: dict[str, str]) -> dict[str, Any]:
    seconds, report = run_sync(config_for(tmp, net, model, [0, 1, 2]), env)
    assert all(n["status"] == "current" for n in report["nodes"]), report
    return {
        "sync_s": round(seconds, 2),
        "source_hashed_bytes": report["hashed_bytes"],
        "nodes_hashed_bytes": [n["hashed_bytes"] for n in report["nodes"]],
    }


def resume(
    tmp: Path, net: MultiHost, model: Path, env: dict[str, str], rate: str
) -> dict[str, Any]:
    clear_copies(net, model, [0])
    config = config_for(tmp, net, model, [0])
    biggest = max((p for p in model.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    staged = net.hosts[0].path(Path(f"{model}.partial-sync") / biggest.name)
    net.shape_mgmt(0, rate)
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "sync", str(config), "--json"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
        start_new_session=True,
    )
    try:
        while not (staged.exists() and staged.stat().st_size > biggest.stat().st_size / 2):
            if proc.poll() is not None:
                raise RuntimeError("the sync ended before it could be interrupted")
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    net.shape_mgmt(0, None)
    seconds, report = run_sync(config, env)
    node = report["nodes"][0]
    return {
        "total_bytes": report["total_bytes"],
        "sent_after_kill": node["sent_bytes"],
        "resumed_bytes": node["resumed_bytes"],
        "saved_share": round(1 - node["sent_bytes"] / report["total_bytes"], 3),
        "resume_sync_s": round(seconds, 2),
    }


def pipeline(tmp: Path, net: MultiHost, mount: Path, env: dict[str, str]) -> dict[str, Any]:
    """Per-host bytes when each pipeline stage gets only its layers' shards."""
    bundled = resolve_model("bundled:smollm2-135m-instruct", default_cache_dir())
    model = mount / "bench-sharded"
    write_sharded_copy(bundled, model, 3)
    nodes = [net.node(i) | {"memory_gb": 1.0} for i in range(3)]
    d = tmp / "cfg-pipeline"
    d.mkdir(exist_ok=True)
    config = write_cluster(d, str(model), nodes, cluster={"parallel": "pipeline"})
    seconds, report = run_sync(config, env)
    total = report["total_bytes"]
    clear_copies(net, model, [0, 1, 2])
    return {
        "model_bytes": total,
        "sync_s": round(seconds, 2),
        "nodes": [
            {
                "layers": n["layers"],
                "need_bytes": n["need_bytes"],
                "sent_bytes": n["sent_bytes"],
                "share_of_model": round(n["need_bytes"] / total, 3),
            }
            for n in report["nodes"]
        ],
        "sum_share_of_3_whole_copies": round(
            sum(n["sent_bytes"] for n in report["nodes"]) / (3 * total), 3
        ),
    }


def forward_3(
    tmp: Path, mount: Path, model: Path, env: dict[str, str], total: int, rates: tuple[str, str]
) -> dict[str, Any]:
    """Head-only vs forwarding over a shaped uplink and shaped cables (section 6)."""
    uplink, cable = rates
    out: dict[str, Any] = {"uplink_rate": uplink, "cable_rate": cable}
    with multi_host(3, "ring", tmp / "ring-hosts", PrivateTmpfs(str(mount), "3g")) as net:
        bridge = f"{net.prefix}m"
        sh(TC, "qdisc", "replace", "dev", bridge, "root", "tbf", "rate", uplink,
           "burst", "256kb", "latency", "200ms")
        for i in range(3):
            net.shape(i, (i + 1) % 3, cable)
        for forwarding in (False, True):
            clear_copies(net, model, [0, 1, 2])
            d = tmp / f"ring-{forwarding}"
            d.mkdir()
            nodes = [net.node(i) for i in range(3)]
            config = write_cluster(d, str(model), nodes, model={"sync_forwarding": forwarding})
            data = tomllib.loads(config.read_text())
            data["links"] = net.links()
            config.write_text(tomli_w.dumps(data))
            sent = int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text())
            seconds, report = run_sync(config, env)
            sent = int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text()) - sent
            assert all(n["status"] == "synced" for n in report["nodes"]), report
            out["forwarding" if forwarding else "head_only"] = {
                "sync_s": round(seconds, 2),
                "head_sent_model_copies": round(sent / total, 2),
                "from": [n["forwarded_from"] or "head" for n in report["nodes"]],
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pad-mb", type=int, default=300)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--resume-rate", default="800mbit")
    parser.add_argument("--uplink-rate", default="400mbit")
    parser.add_argument("--cable-rate", default="2gbit")
    parser.add_argument("--only", default="", help="comma-separated: push_3,unchanged_3,"
                        "push_1,resume_1,pipeline,forward_3 (default: all)")
    parser.add_argument("--profile", type=Path, help="cProfile each sync into this directory")
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile
    only = set(filter(None, args.only.split(",")))

    def wanted(section: str) -> bool:
        return not only or section in only

    results: dict[str, Any] = {"pad_mb": args.pad_mb, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="mco-bench-sync-") as tmp_name:
        tmp = Path(tmp_name)
        mount = tmp / "models"
        model = mount / "bench-model"
        total = make_model(model, args.pad_mb)
        results["model_bytes"] = total
        cache = tmp / "hash-cache"
        env = {CACHE_ENV: str(cache)}
        results["hash_source"] = hashing(model, cache)
        with multi_host(3, "switch", tmp / "hosts", PrivateTmpfs(str(mount), "3g")) as net:
            if wanted("push_3") or wanted("unchanged_3"):
                results["push_3"] = [
                    push(tmp, net, model, [0, 1, 2], env, total) for _ in range(args.runs)
                ]
            if wanted("unchanged_3"):
                results["unchanged_3"] = unchanged(tmp, net, model, env)
            if wanted("push_1"):
                results["push_1"] = [
                    push(tmp, net, model, [0], env, total) for _ in range(args.runs)
                ]
            if wanted("resume_1"):
                results["resume_1"] = resume(tmp, net, model, env, args.resume_rate)
            if wanted("pipeline"):
                results["pipeline_3"] = pipeline(tmp, net, mount, env)
        if wanted("forward_3"):
            rates = (args.uplink_rate, args.cable_rate)
            results["forward_3"] = forward_3(tmp, mount, model, env, total, rates)
    for key in [k for k in ("push_3", "push_1") if k in results]:
        runs = results[key]
        results[f"{key}_median"] = {
            k: statistics.median(r[k] for r in runs)
            for k in ("sync_aggregate_mb_per_s", "rsync_aggregate_mb_per_s", "sync_s", "rsync_s",
                      "rsync_s_over_sync_s")
        }
    out = results_path("model-sync")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
