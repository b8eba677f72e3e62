"""Fingerprint parsers on recorded outputs of macOS and RDMA tools (tests/fixtures/node_tools)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.probes import linux, macos, rdma
from testkit import paths

FIXTURES = paths.FIXTURES / "node_tools"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "product", "version", "build"),
    [
        ("sw_vers_macos14.txt", "macOS", "14.0", "23A344"),
        ("sw_vers_macos26.txt", "macOS", "26.5.1", "25F80"),
        ("sw_vers_macosx_10_13.txt", "Mac OS X", "10.13.1", "17B48"),
    ],
)
def test_sw_vers(name: str, product: str, version: str, build: str) -> None:
    """sw_vers gives product name, version and build, with tabs or spaces."""
    sw = macos.parse_sw_vers(fixture(name))
    assert (sw.product_name, sw.product_version, sw.build_version) == (product, version, build)


def test_sw_vers_garbage_is_an_error() -> None:
    """Output without a ProductVersion is refused, not guessed."""
    with pytest.raises(ValueError, match="ProductVersion"):
        macos.parse_sw_vers("command not found\n")


def test_sysctl_named_and_bare_forms() -> None:
    """`sysctl NAME` and `sysctl -n NAME` both give the value."""
    assert (
        macos.parse_sysctl_int(fixture("sysctl_iogpu_wired_limit_mb.txt"), "iogpu.wired_limit_mb")
        == 40960
    )
    assert (
        macos.parse_sysctl_int(fixture("sysctl_n_iogpu_wired_limit_mb.txt"), "iogpu.wired_limit_mb")
        == 0
    )
    brand = "machdep.cpu.brand_string"
    assert (
        macos.parse_sysctl_value(fixture("sysctl_n_machdep_cpu_brand_string.txt"), brand)
        == "Apple M3 Ultra"
    )


def test_sysctl_picks_the_named_line_from_a_listing() -> None:
    """From `sysctl machdep.cpu` the brand string line is found among the others."""
    text = fixture("sysctl_machdep_cpu.txt")
    lines = [line for line in text.splitlines() if line.startswith("machdep.cpu.brand_string")]
    assert macos.parse_sysctl_value("\n".join(lines), "machdep.cpu.brand_string") == "Apple M1 Pro"


def test_rdma_ctl_status() -> None:
    """rdma_ctl status reads enabled / disabled; anything else is an error."""
    assert rdma.parse_rdma_ctl_status(fixture("rdma_ctl_status_enabled.txt")) == "enabled"
    assert rdma.parse_rdma_ctl_status(fixture("rdma_ctl_status_disabled.txt")) == "disabled"
    with pytest.raises(ValueError):
        rdma.parse_rdma_ctl_status("rdma_ctl: operation not permitted\n")


def test_ibv_devices() -> None:
    """ibv_devices lists device names; the header alone means none."""
    assert rdma.parse_ibv_devices(fixture("ibv_devices_m4pro_mini.txt")) == [
        "rdma_en2",
        "rdma_en3",
        "rdma_en4",
    ]
    assert rdma.parse_ibv_devices(fixture("ibv_devices_rdma_disabled.txt")) == []


def test_ibv_devinfo_inactive_ports() -> None:
    """Every port of a Mac without a peer is PORT_DOWN and not active."""
    devices = rdma.parse_ibv_devinfo(fixture("ibv_devinfo_inactive.txt"))
    assert [d.name for d in devices] == ["rdma_en1", "rdma_en6", "rdma_en2"]
    for d in devices:
        assert d.transport == "Thunderbolt (100)"
        assert [(p.port, p.state, p.active, p.link_layer) for p in d.ports] == [
            (1, "PORT_DOWN", False, "Thunderbolt")
        ]
        assert not d.active


def test_ibv_devinfo_verbose_active_ports_and_speed() -> None:
    """Verbose output gives state, width and speed per port; flags and GIDs are skipped."""
    devices = {d.name: d for d in rdma.parse_ibv_devinfo(fixture("ibv_devinfo_v_active.txt"))}
    assert sorted(devices) == ["rdma_en2", "rdma_en3", "rdma_en4"]
    assert not devices["rdma_en2"].active
    for name in ("rdma_en3", "rdma_en4"):
        (port,) = devices[name].ports
        assert port.state == "PORT_ACTIVE" and port.active
        assert (port.active_width, port.active_speed, port.active_mtu) == (
            "8X",
            "10.0 Gbps",
            "4096",
        )
    assert devices["rdma_en3"].node_guid == "d1b5:e9ab:23cf:ac05"


def test_ibv_devinfo_without_devices() -> None:
    """rdma-core's "No IB devices found" parses to no devices."""
    assert rdma.parse_ibv_devinfo(fixture("ibv_devinfo_no_devices.txt")) == []


def test_os_release_and_cpuinfo() -> None:
    """Linux: distribution from os-release (quoted values), chip from /proc/cpuinfo."""
    fields = linux.parse_os_release(fixture("os_release_debian12.txt"))
    assert (fields["NAME"], fields["VERSION_ID"]) == ("Debian GNU/Linux", "12")
    assert (
        linux.parse_cpuinfo_model(fixture("proc_cpuinfo_x86.txt")) == "Intel(R) Xeon(R) Processor"
    )


def test_os_release_values_are_parsed_not_executed(tmp_path: Path) -> None:
    """A $(...) in os-release stays text."""
    marker = tmp_path / "pwned"
    fields = linux.parse_os_release(f'NAME="$(touch {marker})"\n')
    assert fields["NAME"] == f"$(touch {marker})"
    assert not marker.exists()


def test_vm_stat_wired_bytes() -> None:
    """Wired pages times the page size from vm_stat's header (16 KiB on Apple Silicon)."""
    text = (FIXTURES / "vm_stat_apple_silicon.txt").read_text()
    assert macos.parse_vm_stat_wired(text) == 400018 * 16384
    with pytest.raises(ValueError):
        macos.parse_vm_stat_wired("Pages free: 3.\n")


@pytest.mark.parametrize(
    ("name", "working_set", "share_of_ram"),
    [
        ("mlx_device_info_m4pro_48gb.txt", 40200896512, 0.78),
        ("mlx_device_info_m5max_128gb.txt", 115448725504, 0.84),
        ("mlx_metal_device_info_m2ultra.txt", 188743680000, None),
    ],
)
def test_metal_working_set_from_mlx_device_info(
    name: str, working_set: int, share_of_ram: float | None
) -> None:
    """Metal's recommended working set, from MLX's printed device info (mx.device_info and
    the older mx.metal.device_info); not a fixed share of RAM (78% on 48 GB, 84% on 128 GB)."""
    text = fixture(name)
    assert macos.parse_working_set_bytes(text) == working_set
    if share_of_ram is not None:
        memory = int(text.split("'memory_size': ")[1].split(",")[0])
        assert round(working_set / memory, 2) == share_of_ram


def test_metal_working_set_skips_warnings_and_refuses_garbage() -> None:
    """A deprecation line before the dict is skipped; no dict, or none with the key (Linux's
    CPU-only MLX prints {}), is an error, never a guess."""
    text = "mx.metal.device_info is deprecated\n" + fixture("mlx_device_info_m4pro_48gb.txt")
    assert macos.parse_working_set_bytes(text) == 40200896512
    for bad in ("{}\n", "Traceback (most recent call last):\n", "{'device_name': 'x'}\n"):
        with pytest.raises(ValueError):
            macos.parse_working_set_bytes(bad)
