"""`orchestrator sync` as the sync tests run it across namespace hosts: the model placed
under the hosts' mount point, the CLI's JSON report, and checks of what each host holds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from testkit.netns import MultiHost
from testkit.orchestrator_process import run_cli

NO_STANDBY = {"supervisor": {"standby_ranks": False, "stop_grace_s": 3.0}}


# Wire bytes per file byte over SSH on TCP: headers, MACs and SFTP framing, under 8%.
WIRE_FRAMING = 1.08


def place_model(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, Path]:
    """(mount point, model dir): the source on this machine, under the hosts' mount point."""
    mount = tmp_path / "models"
    model = mount / "tiny"
    shutil.copytree(tiny_model_dir, model)
    return mount, model


def sync(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = run_cli("sync", str(config), "--json", *args, timeout=240)
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"exit {done.returncode}\n{done.stdout}\n{done.stderr}") from None


def by_node(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {node["node"]: node for node in report["nodes"]}


def same_model(net: MultiHost, i: int, model: Path, original: Path) -> bool:
    """Host i's copy at `model` holds original's files, byte for byte (not judged by the
    sync's manifest; hidden files such as sync's marker aside)."""
    return same_files(net.hosts[i].path(model), original)


def same_files(copy: Path, source: Path) -> bool:
    def files(root: Path) -> list[Path]:  # hidden ones aside, as sync's manifests do
        rels = (p.relative_to(root) for p in root.rglob("*") if p.is_file())
        return sorted(r for r in rels if not any(part.startswith(".") for part in r.parts))

    # Read in full each time: filecmp caches by (size, mtime), which a flipped byte keeps.
    return copy.is_dir() and files(copy) == files(source) and all(
        (copy / name).read_bytes() == (source / name).read_bytes() for name in files(source)
    )


def wire_bytes(net: MultiHost) -> list[int]:
    return [net.mgmt_bytes_in(i) for i in range(len(net.hosts))]


def flip_a_byte(path: Path) -> os.stat_result:
    """One bit of the middle byte flipped in place; size and mtime kept (silent rot)."""
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return st
