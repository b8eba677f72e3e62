"""Each launch's secret: only in rank 0's files, new for every plan, never shown by
`plan`, kept owner-only on the head (orchestrator/launch/launch_secret.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import msgspec
import pytest

from contract import launch_secret as contract_secret
from contract.settings import RankSettings
from orchestrator.config import load_cluster
from orchestrator.launch import launch_secret
from orchestrator.launch.plan import build_plan, plan_as_json, plan_as_toml
from testkit.orchestrator_process import write_cluster

LOCAL3 = [{"name": f"r{i}", "ip": "127.0.0.1"} for i in range(3)]


def test_only_rank_0_gets_the_secret_and_every_plan_a_new_one(tmp_path: Path) -> None:
    """Rank 0's files hold the plan's secret; the workers' do not; its settings name the
    file; a second plan (the next launch) draws another 256-bit secret."""
    spec = load_cluster(write_cluster(tmp_path, "bundled:smollm2-135m-instruct", LOCAL3))
    plan, next_plan = build_plan(spec, "L1"), build_plan(spec, "L2")
    rank0, *workers = plan.ranks
    assert rank0.files[contract_secret.FILE] == plan.secret and len(plan.secret) >= 43
    assert all(contract_secret.FILE not in w.files for w in workers)
    assert plan.secret not in json.dumps([w.files for w in workers] + [r.env for r in plan.ranks])
    assert all(plan.secret not in arg for r in plan.ranks for arg in r.argv)
    decoded = msgspec.json.decode(rank0.files["settings.json"], type=RankSettings)
    assert decoded.api_secret_file == contract_secret.FILE
    assert next_plan.secret != plan.secret


def test_plan_output_masks_the_secret(tmp_path: Path) -> None:
    """`orchestrator plan` (TOML or JSON) shows where the secret goes, never its value."""
    spec = load_cluster(write_cluster(tmp_path, "bundled:smollm2-135m-instruct", LOCAL3))
    plan = build_plan(spec, "L1")
    shown_toml, shown_json = plan_as_toml(plan), plan_as_json(plan)
    assert plan.secret not in shown_toml and plan.secret not in shown_json
    data = tomllib.loads(shown_toml)
    assert data["secret"] == "***"
    assert data["ranks"][0]["files"][contract_secret.FILE] == "***"
    assert plan.ranks[0].files[contract_secret.FILE] == plan.secret  # the plan is untouched


def test_the_kept_secret_is_owner_only_and_names_its_launch(tmp_path: Path) -> None:
    """save writes 0600 (its directory 0700 when new); load gives it back for that
    launch, None for another launch or when none is kept."""
    state = tmp_path / "state"
    record = launch_secret.LaunchSecret(launch_id="L1", secret=launch_secret.new_secret())
    launch_secret.save(state, "c", record)
    path = launch_secret.secret_path(state, "c")
    assert path.stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
    assert launch_secret.load(state, "c") == record
    assert launch_secret.load(state, "c", "L1") == record
    assert launch_secret.load(state, "c", "L2") is None
    assert launch_secret.load(state, "other") is None
    launch_secret.remove(state, "c")
    assert launch_secret.load(state, "c") is None


def test_a_kept_secret_others_could_read_is_refused(tmp_path: Path) -> None:
    """Mode 0644: it may be known, so load refuses it, naming the file and the fix."""
    record = launch_secret.LaunchSecret(launch_id="L1", secret="s")
    launch_secret.save(tmp_path, "c", record)
    path = launch_secret.secret_path(tmp_path, "c")
    path.chmod(0o644)
    with pytest.raises(launch_secret.SecretFileError, match=r"readable by others.*down"):
        launch_secret.load(tmp_path, "c")
    path.chmod(0o600)
    path.write_text("not json")
    with pytest.raises(launch_secret.SecretFileError, match="cannot read"):
        launch_secret.load(tmp_path, "c")


def test_rank_0_beyond_loopback_serves_tls_with_a_certificate_of_its_launch(
    tmp_path: Path,
) -> None:
    """Rank 0 on an SSH node: an https URL, its key and certificate in rank 0's files only
    (the key masked in plan output), its settings naming them; a local rank 0 stays on
    loopback HTTP with no certificate."""
    nodes = [{"name": "a", "transport": "ssh", "ssh": "u@10.0.0.5", "ip": "10.0.0.5",
              "python": "/usr/bin/python3"},
             {"name": "b", "ip": "127.0.0.1"}]
    spec = load_cluster(write_cluster(tmp_path, "bundled:smollm2-135m-instruct", nodes))
    plan, next_plan = build_plan(spec, "L1"), build_plan(spec, "L2")
    rank0, worker = plan.ranks
    assert plan.rank0_url.startswith("https://10.0.0.5:")
    assert rank0.files[contract_secret.TLS_CERT_FILE] == plan.tls_cert
    assert "PRIVATE KEY" in rank0.files[contract_secret.TLS_KEY_FILE]
    assert contract_secret.TLS_KEY_FILE not in worker.files
    assert next_plan.tls_cert != plan.tls_cert
    settings = msgspec.json.decode(rank0.files["settings.json"], type=RankSettings)
    assert (settings.api_tls_key_file, settings.api_tls_cert_file) == (
        contract_secret.TLS_KEY_FILE, contract_secret.TLS_CERT_FILE)
    shown = tomllib.loads(plan_as_toml(plan))
    assert shown["ranks"][0]["files"][contract_secret.TLS_KEY_FILE] == "***"
    (tmp_path / "l").mkdir()
    local = build_plan(load_cluster(write_cluster(tmp_path / "l", "bundled:smollm2-135m-instruct",
                                                  LOCAL3)), "L1")
    assert local.rank0_url.startswith("http://127.0.0.1:") and local.tls_cert == ""
