"""`orchestrator models --fit cluster.toml [MODEL ...]` and the `models` fits column: a hub
model's fit from its config.json alone (the test hub counts bytes: no weight is fetched),
the memory left for KV and the full-context sequences it holds, and an unknown memory
answered "unknown", never "fits"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.models.fit import fit
from testkit.config_files import memory_cluster as cluster
from testkit.hub_server import HubServer, serve_dir
from testkit.model_configs import SMOLLM2

WEIGHTS = "model.safetensors"
NODES = """
[[nodes]]
name = "a"
transport = "ssh"
ssh = "me@a.invalid"
python = "python3"
ip = "10.0.0.1"
{a}
[[nodes]]
name = "b"
transport = "ssh"
ssh = "me@b.invalid"
python = "python3"
ip = "10.0.0.2"
{b}
"""


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """org/tiny (SmolLM2's config, 3 MB of weights) on a local hub; an empty HF cache."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(SMOLLM2))
    (repo / WEIGHTS).write_bytes(b"\0" * 3_000_000)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", "")
    with HubServer([serve_dir("org/tiny", repo)]) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def _config(tmp_path: Path, a: str = "memory_gb = 2", b: str = "memory_gb = 1",
            model: str = "bundled:smollm2-135m-instruct") -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(f'[model]\npath = "{model}"\n' + NODES.format(a=a, b=b))
    return path


def _fit_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    code = main(["models", "--fit", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows: list[dict[str, object]] = json.loads(out)
    return rows


def test_a_hub_model_fits_from_its_config_alone(
    tmp_path: Path, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """hf:org/tiny on 2 + 1 GiB: pipeline, KV room on both nodes and the sequences of its
    8192 tokens that fit; the hub sent config.json and not one weight byte."""
    (row,) = _fit_json([str(_config(tmp_path)), "hf:org/tiny"], capsys)
    assert hub.sent["config.json"] > 0 and hub.sent[WEIGHTS] == 0, hub.sent
    result = row["fit"]
    assert isinstance(result, dict) and result["mode"] == "pipeline"
    assert result["context"] == 8192 and isinstance(result["sequences"], int)
    assert result["sequences"] >= 1
    assert "not pulled; no weight downloaded" in str(row["source"])
    assert f"for {result['sequences']} sequences of 8192 tokens" in str(row["fits"])
    assert not (tmp_path / "cache" / "models--org--tiny").exists()  # no HF cache entry


def test_the_models_column_reads_the_hub_config_too(
    tmp_path: Path, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`models cluster.toml` with its hf: model not pulled: the fits column from the hub's
    config (no weight fetched); b without memory_gb: "unknown", naming b."""
    code = main(["models", "--json", str(_config(tmp_path, b="", model="hf:org/tiny"))])
    out, err = capsys.readouterr()
    assert code == 0, err
    (entry,) = json.loads(out)
    assert entry["where"] == "hub"
    assert entry["fits"].startswith("unknown: the memory of b is not known"), entry
    assert hub.sent[WEIGHTS] == 0


def test_unknown_memory_is_unknown_never_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ssh node without memory_gb: "unknown" (it used to count as unlimited: "fits");
    --memory-gb gives it, and the answer is a mode."""
    path = str(_config(tmp_path, b=""))
    (row,) = _fit_json([path], capsys)
    assert isinstance(row["fit"], dict) and row["fit"]["mode"] == "unknown"
    assert str(row["fits"]).startswith("unknown: the memory of b is not known")
    (row,) = _fit_json([path, "--memory-gb", "b=1"], capsys)
    assert isinstance(row["fit"], dict) and row["fit"]["mode"] == "pipeline"


def test_unknown_memory_still_reports_a_refusal_it_does_not_change() -> None:
    """gpt-oss-style heads on 3 ranks with no memory known: refused by architecture, as with
    any memory (a refusal that memory cannot lift is said)."""
    config = SMOLLM2 | {"model_type": "gpt_oss", "num_attention_heads": 8,
                        "num_key_value_heads": 8}
    result = fit(config, 0, cluster([None, None, None]), {})
    assert result is not None and result.mode == "refused" and result.why.startswith("archit")


def test_kv_room_and_sequences() -> None:
    """The KV room is each node's budget less its weights; the sequences are the fewest any
    node holds of its share of one full-context sequence (tensor on 2 + 1 + 1 GiB: equal
    shares, so the 1 GiB nodes bound it)."""
    result = fit(SMOLLM2, 270_000_000, cluster([2, 1, 1]), {})
    assert result is not None and result.mode == "tensor"
    budgets = [2 * 1024**3, 1024**3, 1024**3]
    rooms = [budget - weight for budget, weight in zip(budgets, result.weight_bytes, strict=True)]
    assert list(result.kv_room_bytes) == rooms
    # each rank: 1 of 3 KV heads x 64 dims, 2 bytes, K and V, 30 layers, 8192 tokens
    per_rank = 2 * 1 * 64 * 2 * 30 * 8192
    assert result.sequences == rooms[1] // per_rank < rooms[0] // per_rank
