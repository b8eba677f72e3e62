"""Unit tests of the rank program's pure parts (no processes, no model)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from contract.rank_env import RANKS_ON_MACHINE
from contract.settings import (
    ModelSettings,
    RankSettings,
    ServingSettings,
    SettingsError,
    dump_settings,
)
from serving.blas import _threads_per_rank
from serving.distributed import DistributedEnvError, detect_env, is_peer_lost
from serving.engine.prefill_pacing import MIN_CHUNK, PrefillPacer
from serving.engine.step_plan import (
    HEADER_LEN,
    Insert,
    PlanChannel,
    PlanKind,
    SamplingParams,
    StepPlan,
    decode_payload,
    encode_payload,
)
from serving.faults import Fault, FaultSpecError, parse_faults
from serving.rank.cli import parse_settings
from serving.rank.worker import Desync, check_plan


def test_cli_flags_override_settings_file(tmp_path: Path) -> None:
    """--port overrides the file's api_port; --model alone is enough for development."""
    base = RankSettings(model=ModelSettings(path="m"), serving=ServingSettings(rank_api_port=9000))
    dump_settings(base, tmp_path / "s.json")
    settings = parse_settings(["--settings", str(tmp_path / "s.json"), "--port", "9100"])
    assert (settings.model.path, settings.serving.rank_api_port) == ("m", 9100)
    assert parse_settings(["--model", "bundled:x"]).model.path == "bundled:x"
    with pytest.raises(SettingsError):
        parse_settings([])


def test_detect_env_picks_backend() -> None:
    """No env = single rank; MLX_HOSTFILE = ring; MLX_JACCL_COORDINATOR = jaccl."""
    assert detect_env({}).backend is None
    ring = detect_env({"MLX_RANK": "2", "MLX_HOSTFILE": "/h.json"})
    assert (ring.backend, ring.rank) == ("ring", 2)
    jaccl = {"MLX_RANK": "1", "MLX_JACCL_COORDINATOR": "10.0.0.1:5000", "MLX_IBV_DEVICES": "/d"}
    assert detect_env(jaccl).backend == "jaccl"
    for bad in (
        {"MLX_RANK": "1"},
        {"MLX_HOSTFILE": "/h"},
        {"MLX_RANK": "x", "MLX_HOSTFILE": "/h"},
        {"MLX_RANK": "0", "MLX_JACCL_COORDINATOR": "a:1"},
    ):
        with pytest.raises(DistributedEnvError):
            detect_env(bad)


def test_fault_syntax() -> None:
    """Faults parse from ORCHESTRATOR_FAULT; malformed specs are rejected."""
    faults = parse_faults("desync:rank=1:step=5,exit:rank=2:step=3:code=42,ebusy:rank=0")
    assert faults == [Fault("desync", 1, 5), Fault("exit", 2, 3, 42), Fault("ebusy", 0)]
    for bad in ("boom:rank=1", "exit:rank=1", "hang:step=3", "exit:rank=x:step=1",
                "crash_on:rank=1", "exit:rank=1:step=2:text=x"):
        with pytest.raises(FaultSpecError):
            parse_faults(bad)
    assert parse_faults("crash_on:rank=1:text=zebra") == [
        Fault("crash_on", 1, text="zebra")]


def test_plan_payload_round_trip() -> None:
    """Inserts and removes survive msgpack; an unchanged batch has no payload at all."""
    params = SamplingParams(0.7, 0.9, 40, 16, 1234)
    plan = StepPlan(PlanKind.STEP, 3, 99, 7, 1, inserts=[Insert("r1", [1, 2, 3], params)],
                    removes=[5])
    payload = decode_payload(encode_payload(plan))
    assert payload.inserts == plan.inserts and payload.removes == [5]
    assert encode_payload(StepPlan(PlanKind.STEP, 4, 99, 7, 2)) == b""


def test_prefill_chunk_keeps_decode_steps_within_the_slowdown() -> None:
    """A prompt alone gets whole chunks; beside decoding streams, a chunk that fits the
    time left in a step of `max_slowdown` decode steps, shared by the prompts, never
    more than the maximum nor less than the minimum; measured before it grows."""
    pacer = PrefillPacer(max_chunk=512, max_slowdown=3.0)
    assert pacer.chunk(decoding=0, prefilling=1) == 512
    assert pacer.chunk(decoding=4, prefilling=0) == 512
    assert pacer.chunk(decoding=4, prefilling=1) == MIN_CHUNK  # nothing measured yet
    pacer.observe(step_s=0.1, prompt_tokens=0, prompt_s=0.0)  # a decode-only step
    pacer.observe(step_s=0.5, prompt_tokens=40, prompt_s=0.4)  # 10 ms per prompt token
    assert pacer.chunk(decoding=4, prefilling=1) == 20  # (3 - 1) x 0.1 s / 10 ms
    assert pacer.chunk(decoding=4, prefilling=2) == MIN_CHUNK  # 10 each, raised to the floor
    pacer.observe(step_s=0.3, prompt_tokens=400, prompt_s=0.2)  # faster per token now
    assert 20 < pacer.chunk(decoding=4, prefilling=1) < 512
    pacer.observe(step_s=9.0, prompt_tokens=0, prompt_s=0.0)
    pacer.observe(step_s=9.0, prompt_tokens=0, prompt_s=0.0)
    assert pacer.chunk(decoding=4, prefilling=1) == 512  # slow decode steps: room for all
    assert PrefillPacer(512, 0).chunk(decoding=4, prefilling=1) == 512  # off
    # A token costs what it adds to the whole step (here 40 ms), not mlx-lm's prefill timer
    # alone (10 ms): the step's decode slowed down too.
    slowed = PrefillPacer(max_chunk=512, max_slowdown=9.0)
    slowed.observe(step_s=0.1, prompt_tokens=0, prompt_s=0.0)
    slowed.observe(step_s=0.9, prompt_tokens=20, prompt_s=0.2)
    assert slowed.chunk(decoding=4, prefilling=1) == 20  # (9 - 1) x 0.1 s / 40 ms


def test_worker_checks_step_fingerprint_and_token_digest() -> None:
    """A skipped step id, another batch or other tokens for the step the plan names is
    a desync; the digest may name the step just finished (a plan sent while idle) or
    the one before (a plan queued ahead of its predecessor)."""
    digests = {2: 11, 3: 13}
    check_plan(StepPlan(PlanKind.STEP, 4, 99, 13, 3), 4, 99, digests)
    check_plan(StepPlan(PlanKind.STEP, 4, 99, 11, 2), 4, 99, digests)
    with pytest.raises(Desync, match="step id rank0=5 local=4"):
        check_plan(StepPlan(PlanKind.STEP, 5, 99, 13, 3), 4, 99, digests)
    with pytest.raises(Desync, match="fingerprint after step 3's plan"):
        check_plan(StepPlan(PlanKind.STEP, 4, 98, 13, 3), 4, 99, digests)
    with pytest.raises(Desync, match="token digest of step 2"):
        check_plan(StepPlan(PlanKind.STEP, 4, 99, 13, 2), 4, 99, digests)
    with pytest.raises(Desync, match=r"token digest of step 1 .* local=none"):
        check_plan(StepPlan(PlanKind.STEP, 4, 99, 13, 1), 4, 99, digests)


def test_a_header_without_rank0s_data_is_a_lost_peer() -> None:
    """MLX 0.32's ring can complete a failed collective with zeros; rank 0 never sends
    kind 0, so such a header means a peer is gone (exit 13), not an internal error."""
    import mlx.core as mx

    channel = PlanChannel(mx.distributed.init(), mx.cpu)
    with pytest.raises(RuntimeError) as caught:
        channel.finish_receive(mx.zeros(HEADER_LEN, dtype=mx.int64))
    assert is_peer_lost(caught.value)


def test_blas_threads_split_among_the_ranks_of_one_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch plan's count wins; without it, the ranks behind this rank's address."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))  # 8 CPUs of ours
    hostfile = tmp_path / "hostfile.json"
    hostfile.write_text('[["10.0.0.1:1"], ["10.0.0.1:2"], ["10.0.0.2:3"], ["10.0.0.1:4"]]')
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    monkeypatch.setenv("MLX_RANK", "1")
    assert _threads_per_rank() == 2  # 3 ranks behind 10.0.0.1
    monkeypatch.setenv("ORCHESTRATOR_RANKS_ON_MACHINE", "4")
    assert _threads_per_rank() == 2
    monkeypatch.setenv("ORCHESTRATOR_RANKS_ON_MACHINE", "1")
    assert _threads_per_rank() == 8
    monkeypatch.setenv("MLX_RANK", "2")
    monkeypatch.delenv("ORCHESTRATOR_RANKS_ON_MACHINE")
    assert _threads_per_rank() == 8  # alone behind 10.0.0.2
    monkeypatch.setenv("ORCHESTRATOR_RANKS_ON_MACHINE", "16")
    assert _threads_per_rank() == 1


def test_blas_threads_follow_the_cpus_this_rank_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinned to one CPU (as a container's cpuset or taskset would), a rank alone on its
    machine runs one BLAS thread, whatever the host's count."""
    monkeypatch.setenv("ORCHESTRATOR_RANKS_ON_MACHINE", "1")
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        assert _threads_per_rank() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    assert _threads_per_rank() == len(allowed)


def test_prefix_cache_default_is_shared_by_the_ranks_of_one_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every rank on a machine sees all of its free memory: three of them take a third
    each of what one alone would. A configured bound is taken as it is."""
    import mlx.core as mx

    from serving.rank import startup

    free = 12 * 10**9
    monkeypatch.setattr(startup.psutil, "virtual_memory", lambda: SimpleNamespace(available=free))
    group = mx.distributed.init()  # one rank: no collective
    settings = RankSettings(model=ModelSettings(path="m"))
    monkeypatch.setenv(RANKS_ON_MACHINE, "1")
    assert startup.prompt_cache_bytes(settings, group) == free * startup.DEFAULT_CACHE_SHARE
    monkeypatch.setenv(RANKS_ON_MACHINE, "3")
    assert startup.prompt_cache_bytes(settings, group) == free * startup.DEFAULT_CACHE_SHARE // 3
    configured = RankSettings(
        model=ModelSettings(path="m"), serving=ServingSettings(prompt_cache_gb=2)
    )
    assert startup.prompt_cache_bytes(configured, group) == 2 * 10**9


def test_prefix_cache_bound_is_agreed_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline rank's bound is a whole number of per-layer bounds (so ranks holding
    different layer counts evict alike); None layers (mixed cache kinds) means no cache."""
    import mlx.core as mx

    from serving.rank import startup

    free = 12 * 10**9 + 7
    monkeypatch.setattr(startup.psutil, "virtual_memory", lambda: SimpleNamespace(available=free))
    monkeypatch.setenv(RANKS_ON_MACHINE, "1")
    group = mx.distributed.init()
    settings = RankSettings(model=ModelSettings(path="m"))
    bound = startup.prompt_cache_bytes(settings, group, 7)
    assert bound % 7 == 0 and free * startup.DEFAULT_CACHE_SHARE - bound < 7
    assert startup.prompt_cache_bytes(settings, group, None) == 0
