"""Our JACCL device matrices and launch variables against MLX's own: the hostfile that
`mlx.distributed_config` writes for the same cabling (mlx/_distributed_utils/config.py,
run here with its Mac commands answered from the cabling), launched as `mlx.launch` would
(mlx/_distributed_utils/launch.py, its process start caught)."""

from __future__ import annotations

import json
import subprocess
from argparse import ArgumentParser, Namespace
from pathlib import Path
from typing import Any

import pytest
from mlx._distributed_utils import config as mlx_config
from mlx._distributed_utils import launch as mlx_launch
from mlx._distributed_utils.common import Host, Hostfile

from orchestrator.config import load_cluster
from orchestrator.launch.plan import build_plan
from testkit.orchestrator_process import write_cluster

Cable = tuple[str, str, str, str]  # node a, node b, a's interface, b's interface
IPS = {"s1": "10.1.0.10", "s2": "10.1.0.11", "s3": "10.1.0.12", "s4": "10.1.0.13"}


class Macs:
    """The answers a Mac gives MLX's configurator over ssh, for these cables."""

    def __init__(self, cables: list[Cable]) -> None:
        self.ports: dict[str, dict[str, str | None]] = {}  # node -> interface -> peer uuid
        for a, b, ia, ib in cables:
            self.ports.setdefault(a, {})[ia] = f"{b}/{ib}"
            self.ports.setdefault(b, {})[ib] = f"{a}/{ia}"

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[Any]:
        host, *command = argv[1:]
        text: str | bytes = ""
        if command[:1] == ["system_profiler"]:
            text = json.dumps({"SPThunderboltDataType": [
                {"domain_uuid_key": f"{host}/{iface}", "device_name_key": host,
                 "receptacle_1_tag": {"receptacle_id_key": iface.removeprefix("en")},
                 "_items": [{"domain_uuid_key": peer}] if peer else []}
                for iface, peer in self.ports[host].items()]}).encode()
        elif command[:1] == ["networksetup"]:
            text = "".join(f"Hardware Port: Thunderbolt {i.removeprefix('en')}\nDevice: {i}\n"
                           for i in self.ports[host]).encode()
        elif command == ["ipconfig", "getifaddr", "en0"]:
            text = IPS[host] + "\n"
        elif command == ["ibv_devices"]:
            text = "".join(f"rdma_{iface} 0x0\n" for iface in self.ports[host])
        return subprocess.CompletedProcess(argv, 0, text, "")


def mlx_hostfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: list[str],
                 cables: list[Cable], backend: str | None) -> Hostfile:
    """What `mlx.distributed_config --over thunderbolt [--backend B] --auto-setup` writes."""
    monkeypatch.setattr(mlx_config, "run", Macs(cables))
    path = tmp_path / "mlx-hostfile.json"
    args = Namespace(verbose=False, dot=False, backend=backend, auto_setup=True, env=[],
                     output_hostfile=str(path))
    hosts = [Host(i, name, [], []) for i, name in enumerate(nodes)]
    mlx_config.prepare_tb_hostfile(args, hosts, [mlx_config.SSHInfo(True, True)] * len(nodes))
    return Hostfile.from_file(path)


def mlx_launch_of(hostfile: Hostfile, monkeypatch: pytest.MonkeyPatch, port: int
                  ) -> tuple[list[list[str]], list[Any]]:
    """What `mlx.launch --hostfile` gives each rank: its environment and MLX_IBV_DEVICES."""
    started: list[Any] = []
    monkeypatch.setattr(mlx_launch, "_launch_with_io",
                        lambda _cls, arguments, _verbose: started.extend(arguments))
    args = Namespace(env=[], cwd=None, starting_port=port, python="python3", verbose=False,
                     backend=hostfile.backend or "jaccl")
    mlx_launch.launch_jaccl(ArgumentParser(), hostfile.hosts, args, ["serve"])
    envs = [list(positional[5]) for positional, _ in started]
    matrices = [json.loads(positional[4]["MLX_IBV_DEVICES"]) for positional, _ in started]
    return envs, matrices


def ours(tmp_path: Path, nodes: list[str], cables: list[Cable]) -> tuple[list[Any], Any]:
    """Our plan for the same cabling as [[links]]: each rank's env and device matrix."""
    config = write_cluster(
        tmp_path, "bundled:smollm2-135m-instruct",
        [{"name": n, "ip": IPS[n]} for n in nodes],
        cluster={"backend": "jaccl"})
    text = config.read_text() + "".join(
        f'\n[[links]]\nbetween = ["{a}", "{b}"]\nrdma = ["rdma_{ia}", "rdma_{ib}"]\n'
        for a, b, ia, ib in cables)
    config.write_text(text)
    plan = build_plan(load_cluster(config), "L1")
    return [r.env for r in plan.ranks], [json.loads(r.files["ibv_devices.json"])
                                         for r in plan.ranks]


FOUR_IN_A_RING = [("s1", "s2", "en2", "en3"), ("s2", "s3", "en2", "en3"),
                  ("s3", "s4", "en2", "en3"), ("s4", "s1", "en2", "en3")]
THREE_IN_A_RING = [("s1", "s2", "en2", "en5"), ("s2", "s3", "en3", "en4"),
                   ("s3", "s1", "en6", "en7")]
TWO_CABLES = [("s1", "s2", "en2", "en4"), ("s2", "s1", "en5", "en3")]


@pytest.mark.parametrize(
    ("nodes", "cables"),
    [(["s1", "s2", "s3", "s4"], FOUR_IN_A_RING), (["s1", "s2", "s3"], THREE_IN_A_RING),
     (["s1", "s2"], TWO_CABLES)],
    ids=["four in a ring", "three in a ring", "two macs two cables"],
)
def test_a_ring_of_cables_gets_mlxs_jaccl_ring_matrix_and_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: list[str], cables: list[Cable]
) -> None:
    """The cabling as [[links]]: every rank's matrix is the one MLX's configurator writes
    with --backend jaccl-ring, and its coordinator and MLX_JACCL_RING what mlx.launch sets."""
    hostfile = mlx_hostfile(tmp_path, monkeypatch, nodes, cables, "jaccl-ring")
    envs, matrices = ours(tmp_path, nodes, cables)
    port = int(envs[0]["MLX_JACCL_COORDINATOR"].rsplit(":", 1)[1])
    mlx_envs, mlx_matrices = mlx_launch_of(hostfile, monkeypatch, port)
    assert [h.ssh_hostname for h in hostfile.hosts] == nodes  # ranks in the same order
    assert matrices == mlx_matrices
    for env, mlx_env in zip(envs, mlx_envs, strict=True):
        assert sorted(f"{k}={v}" for k, v in env.items() if k.startswith("MLX_JACCL")) == sorted(
            mlx_env)


def test_two_macs_on_one_cable_are_the_mesh_mlx_picks_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One cable between two Macs: MLX's configurator, left to choose, writes a jaccl mesh
    (no MLX_JACCL_RING); ours is the same matrix and leaves the flag out too."""
    cables = [("s1", "s2", "en2", "en4")]
    hostfile = mlx_hostfile(tmp_path, monkeypatch, ["s1", "s2"], cables, None)
    assert hostfile.backend == "jaccl"
    envs, matrices = ours(tmp_path, ["s1", "s2"], cables)
    port = int(envs[0]["MLX_JACCL_COORDINATOR"].rsplit(":", 1)[1])
    mlx_envs, mlx_matrices = mlx_launch_of(hostfile, monkeypatch, port)
    assert matrices == mlx_matrices == [[[None, "rdma_en2"], ["rdma_en4", None]]] * 2
    assert [sorted(f"{k}={v}" for k, v in env.items() if k.startswith("MLX_JACCL"))
            for env in envs] == [sorted(env) for env in mlx_envs]
