"""`orchestrator sync` with [model] sync_forwarding on a cabled ring of 3 namespace hosts:
the head sends the model once (to h0, over SSH); h1 fetches from h0 and h2 from h1 over
their cables; a byte rotten at a forwarding node is caught at the next hop."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w

from testkit.netns import HostsFactory, MultiHost, PrivateTmpfs
from testkit.orchestrator_process import write_cluster
from testkit.sync_runs import (
    NO_STANDBY,
    WIRE_FRAMING,
    by_node,
    flip_a_byte,
    place_model,
    same_model,
    sync,
    wire_bytes,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PAD = "pad.bin"  # weights-sized bytes, so the model dwarfs the agents' own traffic
TALK = 2e6  # a host's SSH bytes besides files: agent code check, requests, manifests
HASH_CACHE = Path("~/.cache/mlx-cluster-orchestrator/file-hashes").expanduser()


def ring_config(tmp_path: Path, net: MultiHost, model: Path) -> Path:
    nodes = [net.node(i) for i in range(len(net.hosts))]
    config = write_cluster(
        tmp_path, str(model), nodes, model={"sync_forwarding": True}, **NO_STANDBY
    )
    data = tomllib.loads(config.read_text())
    data["links"] = net.links()
    config.write_text(tomli_w.dumps(data))
    return config


def rot_silently(path: Path, as_the_node_sees_it: Path) -> None:
    """A byte flipped and the node's hash cache left believing the file is intact (as after
    a memory or disk fault behind the file system's back): only another hop can tell."""
    flip_a_byte(path)
    st = path.stat()
    key = f"{st.st_dev}:{st.st_ino}"  # (an earlier run's tmpfs may have had the same)
    found = False
    for cache in HASH_CACHE.glob("*.json"):
        entries = json.loads(cache.read_text())
        if key in entries and entries[key][4] == str(as_the_node_sees_it):
            entries[key][:3] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            cache.write_text(json.dumps(entries))
            found = True
    assert found, f"no hash cache entry {key} for {as_the_node_sees_it} under {HASH_CACHE}"


def test_forwarding_sends_the_model_once_and_checks_every_hop(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    mount, model = place_model(tmp_path, tiny_model_dir)
    (model / PAD).write_bytes(os.urandom(16 << 20))
    size = sum(p.stat().st_size for p in model.iterdir())
    net = netns_hosts(3, "ring", PrivateTmpfs(str(mount), "128m"))
    config = ring_config(tmp_path, net, model)
    before = wire_bytes(net)
    code, report = sync(config)
    arrived = [after - b for after, b in zip(wire_bytes(net), before, strict=True)]
    nodes = by_node(report)
    assert code == 0 and all(n["status"] == "synced" for n in nodes.values()), report
    forwarded = [nodes[h]["forwarded_from"] for h in ("h0", "h1", "h2")]
    assert forwarded == ["", "h0", "h1"], [nodes[h].get("forward_error") for h in nodes]
    assert all(nodes[h]["sent_bytes"] == size for h in nodes)
    for i in range(3):
        assert same_model(net, i, model, model)  # tiny model + PAD, byte for byte
    # The head's links carried the model once: into h0; h1 and h2 only the agents' talk.
    assert size <= arrived[0] <= size * WIRE_FRAMING + TALK, arrived
    assert arrived[1] < TALK and arrived[2] < TALK, arrived

    rot_silently(net.hosts[1].path(model / PAD), model / PAD)
    shutil.rmtree(net.hosts[2].path(model))
    code, second = sync(config)
    nodes = by_node(second)
    assert code == 0, second
    assert nodes["h0"]["status"] == nodes["h1"]["status"] == "current", second
    h2 = nodes["h2"]
    assert h2["status"] == "synced" and h2["forwarded_from"] == "", h2  # the head pushed
    assert PAD in h2["forward_error"] and "differ" in h2["forward_error"], h2
    assert same_model(net, 2, model, model)
