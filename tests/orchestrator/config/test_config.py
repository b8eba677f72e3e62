"""cluster.toml loading: examples validate, broken files name the field and the fix."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from contract.fingerprint import NodeFingerprint
from node_agent.fingerprint import collect_fingerprint
from orchestrator.config import ConfigErrors, check_cluster_file, load_cluster
from orchestrator.config.links import hops
from orchestrator.launch.plan import build_plan
from orchestrator.transports import ErrorKind, SshTransport, TransportError
from testkit import paths
from testkit.config_files import errors_of, write

ROOT = paths.ROOT
EXAMPLES = [ROOT / "cluster.toml.example", *sorted((ROOT / "docs" / "examples").glob("*.toml"))]

LOCAL_NODE = '[[nodes]]\nname = "a"\n'
TWO_RING_NODES = """
[[nodes]]
name = "a"
ip = "127.0.0.1"
[[nodes]]
name = "b"
ip = "127.0.0.1"
"""
# A cabled ring: a /30 per cable, each node a different address towards each neighbour.
RING_OF_THREE = """
[[nodes]]
name = "a"
[[nodes]]
name = "b"
[[nodes]]
name = "c"
[[links]]
between = ["a", "b"]
ips = ["10.0.1.1", "10.0.1.2"]
[[links]]
between = ["b", "c"]
ips = ["10.0.2.1", "10.0.2.2"]
[[links]]
between = ["c", "a"]
ips = ["10.0.3.2", "10.0.3.1"]
"""
JACCL_PAIR = """
[cluster]
backend = "jaccl"
[[nodes]]
name = "a"
ip = "10.0.0.1"
rdma = ["", "rdma_en3"]
[[nodes]]
name = "b"
transport = "ssh"
ssh = "me@b"
ip = "10.0.0.2"
rdma = ["rdma_en3", ""]
"""


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_examples_validate(example: Path) -> None:
    """The shipped example and every docs example are valid configs."""
    spec, _warnings = check_cluster_file(example)
    assert spec.world_size >= 1


def test_example_is_two_local_pipeline_ranks() -> None:
    """cluster.toml.example runs as-is on one machine: 2 local pipeline ranks over ring,
    the bundled model (the demo that answers at once, bench/demo.py); the 3-rank tensor
    demo is docs/examples/local-3-tensor.toml."""
    spec = load_cluster(ROOT / "cluster.toml.example")
    assert (spec.cluster.backend, spec.cluster.parallel) == ("ring", "pipeline")
    assert [node.transport for node in spec.nodes] == ["local"] * 2
    assert spec.model.path == "bundled:smollm2-135m-instruct"
    tensor = load_cluster(ROOT / "docs" / "examples" / "local-3-tensor.toml")
    assert (tensor.cluster.parallel, tensor.world_size) == ("tensor", 3)


def test_only_nodes_are_required(tmp_path: Path) -> None:
    """A file with one node gets a default for everything else."""
    spec = load_cluster(write(tmp_path, LOCAL_NODE))
    assert spec.api.port == 8000
    assert spec.supervisor.backoff_max_s == 60
    assert spec.model.served_id == "smollm2-135m-instruct"
    assert spec.nodes[0].python_executable == sys.executable


BROKEN = [
    ("no nodes", "[cluster]\nname = 'x'\n", "nodes", "missing required key"),
    ("unknown top-level key", LOCAL_NODE + "[sevring]\n", "sevring", "unknown key"),
    ("unknown node key", LOCAL_NODE + "adress = '1.2.3.4'\n", "nodes[0].adress", "unknown key"),
    ("kv_bits not 4 or 8", LOCAL_NODE + "[serving]\nkv_bits = 3\n", "serving.kv_bits", "3"),
    (
        "kv_group_size mlx cannot quantize by",
        LOCAL_NODE + "[serving]\nkv_group_size = 48\n",
        "serving.kv_group_size",
        "48",
    ),
    ("bad backend", LOCAL_NODE + "[cluster]\nbackend = 'mpi'\n", "cluster.backend", "'mpi'"),
    (
        "bad transport",
        '[[nodes]]\nname = "a"\ntransport = "telnet"\n',
        "nodes[0].transport",
        "telnet",
    ),
    ("port out of range", LOCAL_NODE + "[api]\nport = 70000\n", "api.port", "<= 65535"),
    ("port wrong type", LOCAL_NODE + "[api]\nport = '8000'\n", "api.port", "Expected `int`"),
    (
        "zero batch",
        LOCAL_NODE + "[serving]\nmax_batch_size = 0\n",
        "serving.max_batch_size",
        ">= 1",
    ),
    (
        "negative backoff",
        LOCAL_NODE + "[supervisor]\nbackoff_initial_s = -1\n",
        "supervisor.backoff_initial_s",
        ">= 0",
    ),
    ("node name missing", "[[nodes]]\nip = '127.0.0.1'\n", "nodes[0].name", "missing required key"),
    ("bad node name", '[[nodes]]\nname = "a b"\n', "nodes[0].name", "a b"),
    (
        "duplicate names",
        '[[nodes]]\nname = "a"\nip = "127.0.0.1"\n[[nodes]]\nname = "a"\nip = "127.0.0.2"\n',
        "nodes[1].name",
        "already the name of nodes[0]",
    ),
    (
        "ring needs ip",
        '[[nodes]]\nname = "a"\n[[nodes]]\nname = "b"\nip = "127.0.0.1"\n',
        "nodes[0].ip",
        "missing",
    ),
    (
        "ip not an address",
        '[[nodes]]\nname = "a"\nip = "mac-a.local"\n',
        "nodes[0].ip",
        "not an IP address",
    ),
    (
        "ssh without target",
        '[[nodes]]\nname = "a"\ntransport = "ssh"\n',
        "nodes[0].ssh",
        "no ssh target",
    ),
    (
        "ssh target is an option",
        '[[nodes]]\nname = "a"\ntransport = "ssh"\nssh = "-oProxyCommand=x"\n',
        "nodes[0].ssh",
        "starts with '-'",
    ),
    (
        "bad api key env",
        LOCAL_NODE + "[api]\napi_key_env = 'sk-123'\n",
        "api.api_key_env",
        "not a valid environment variable name",
    ),
    ("bad env name", LOCAL_NODE + "[nodes.env]\n'1X' = 'y'\n", "nodes[0].env.1X", "not a valid"),
    (
        "reserved env",
        LOCAL_NODE + "[nodes.env]\nMLX_RANK = '3'\n",
        "nodes[0].env.MLX_RANK",
        "set by the orchestrator",
    ),
    (
        "unknown bundled model",
        LOCAL_NODE + "[model]\npath = 'bundled:llama-9000'\n",
        "model.path",
        "unknown bundled model",
    ),
    (
        "default above limit",
        LOCAL_NODE + "[serving]\nmax_tokens_default = 9000\n",
        "serving.max_tokens_default",
        "above max_tokens_limit",
    ),
    (
        "port clash",
        TWO_RING_NODES + "[serving]\nrank_api_port = 52101\n",
        "serving.rank_api_port",
        "127.0.0.1:52101 is used by rank 1 (b) and rank 0's API",
    ),
    (
        "gateway port clash",
        LOCAL_NODE + "[cluster]\nrank_port = 65535\n[api]\nport=65535\n",
        "api.port",
        "used by rank 0 (a) and the gateway",
    ),
    ("api host with shell", LOCAL_NODE + "[api]\nhost = 'a host;$(id)'\n", "api.host", "neither"),
    (
        "environment too large",
        LOCAL_NODE + "[nodes.env]\nBIG = '" + "x" * 70_000 + "'\n",
        "nodes[0].env",
        "holds 68 KiB",
    ),
    ("ipv6 ring address", TWO_RING_NODES.replace('"127.0.0.1"', '"::1"'), "nodes[0].ip", "IPv6"),
    (
        "link to an unknown node",
        RING_OF_THREE.replace('between = ["c", "a"]', 'between = ["c", "z"]'),
        "links[2].between[1]",
        "'z' is not a node",
    ),
    (
        "links that are not a ring",
        RING_OF_THREE.replace('between = ["c", "a"]', 'between = ["a", "b"]'),
        "links",
        "no link between c and a: the ring a -> b -> c -> a is not closed",
    ),
    (
        "link between non-neighbours",
        RING_OF_THREE.replace(
            '[[nodes]]\nname = "c"', '[[nodes]]\nname = "d"\n[[nodes]]\nname = "c"'
        ),
        "links[1].between",
        "b and c are not neighbours",
    ),
    (
        "ipv6 on a link",
        RING_OF_THREE.replace('"10.0.3.1"', '"fd00::1"'),
        "links[2].ips[1]",
        "IPv6",
    ),
    (
        "jaccl links without devices",
        JACCL_PAIR + '[[links]]\nbetween = ["a", "b"]\nips = ["10.0.1.1", "10.0.1.2"]\n',
        "links[0].rdma",
        "missing: a jaccl ring names each end's RDMA device",
    ),
    (
        "jaccl without rdma",
        JACCL_PAIR.replace('rdma = ["", "rdma_en3"]', ""),
        "nodes[0].rdma",
        "missing",
    ),
    (
        "jaccl rdma wrong length",
        JACCL_PAIR.replace('["", "rdma_en3"]', '[""]'),
        "nodes[0].rdma",
        "has 1 entries for 2 nodes",
    ),
    (
        "jaccl rdma self link",
        JACCL_PAIR.replace('["", "rdma_en3"]', '["rdma_en2", "rdma_en3"]'),
        "nodes[0].rdma[0]",
        "at the node's own index",
    ),
    (
        "jaccl rdma missing peer",
        JACCL_PAIR.replace('["rdma_en3", ""]', '["", ""]'),
        "nodes[1].rdma[0]",
        "no device towards a",
    ),
    (
        "hf model without org",
        LOCAL_NODE + '[model]\npath = "hf:Qwen3-30B"\n',
        "model.path",
        "is not hf:ORG/NAME",
    ),
    (
        "hf model with a double dash",
        LOCAL_NODE + '[model]\npath = "hf:mlx--community/Qwen3"\n',
        "model.path",
        "no '--'",
    ),
    (
        "hf model whose revision leaves the cache",
        LOCAL_NODE + '[model]\npath = "hf:org/name@../../x"\n',
        "model.path",
        "the revision '../../x' is not a safe path part",
    ),
    ("section not a table", "api = 3\n" + LOCAL_NODE, "api", "expected a table"),
    ("nodes not tables", "nodes = 3\n", "nodes", "expected a list of tables"),
]


@pytest.mark.parametrize(
    ("text", "path", "fragment"), [case[1:] for case in BROKEN], ids=[case[0] for case in BROKEN]
)
def test_broken_config_names_field(tmp_path: Path, text: str, path: str, fragment: str) -> None:
    """Each broken config reports the field path with a message and a fix."""
    issues = errors_of(tmp_path, text)
    matching = [issue for issue in issues if issue.path == path]
    assert matching, f"no issue at {path}: {issues}"
    assert any(fragment in issue.message for issue in matching), matching
    assert all(issue.fix for issue in matching)


@pytest.mark.parametrize(
    ("text", "path", "fix"),
    [
        ("[api]\nport = '8000'\n", "api.port", "use an integer from 1 to 65535"),
        ("[serving]\nmax_batch_size = 0\n", "serving.max_batch_size", "use an integer >= 1"),
        ("[serving]\nrequest_timeout_s = 0\n", "serving.request_timeout_s", "use a number > 0"),
        ("[serving]\nprompt_cache_gb = 'all'\n", "serving.prompt_cache_gb", "use a number >= 0"),
        ("[serving]\ncomm_profile = 1\n", "serving.comm_profile", "use true or false"),
        (
            '[[links]]\nbetween = ["a"]\nips = ["10.0.0.1", "10.0.0.2"]\n',
            "links[0].between",
            "use a list of exactly 2 items, each item a string of at most 64 characters, "
            "matching ^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        ),
        ("[nodes.env]\nA = 1\n", "nodes[0].env", "use a table of NAME = a string"),
        # A node's memory share (pipeline placement weighs by it): 0 or less is named.
        ("memory_gb = 0\n", "nodes[0].memory_gb", "use a number > 0"),
        ("memory_gb = -2.5\n", "nodes[0].memory_gb", "use a number > 0"),
    ],
)
def test_a_wrong_value_is_told_what_would_do(
    tmp_path: Path, text: str, path: str, fix: str
) -> None:
    """The fix says what a valid value looks like, from the key's type and limits."""
    (issue,) = errors_of(tmp_path, LOCAL_NODE + text)
    assert (issue.path, issue.fix) == (path, fix)


def test_every_error_reported_at_once(tmp_path: Path) -> None:
    """Three independent mistakes give three issues, not one."""
    text = LOCAL_NODE + "colour = 'red'\n[api]\nport = 0\n[cluster]\nbackend = 'x'\n"
    paths = {issue.path for issue in errors_of(tmp_path, text)}
    assert paths == {"nodes[0].colour", "api.port", "cluster.backend"}


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    """A typo is named with the key it probably meant."""
    (issue,) = errors_of(tmp_path, LOCAL_NODE + "[api]\nprot = 8000\n")
    assert "did you mean 'port'" in issue.fix


def test_toml_syntax_error_shows_line_and_column(tmp_path: Path) -> None:
    """A syntax error points at its line and column."""
    (issue,) = errors_of(tmp_path, LOCAL_NODE + "[api]\nport = = 3\n")
    assert "line 4" in issue.message and "column" in issue.message


def test_missing_file(tmp_path: Path) -> None:
    """A path that does not exist is one clear error."""
    with pytest.raises(ConfigErrors, match="file not found"):
        check_cluster_file(tmp_path / "nope.toml")


def test_warnings_do_not_fail(tmp_path: Path) -> None:
    """Router subnets on a cable, MLX_METAL_FAST_SYNCH (MLX: can deadlock) and a bare python3
    over SSH warn but load; a jaccl node's LAN ip (the coordinator) does not warn."""
    text = (
        JACCL_PAIR.replace("10.0.0.1", "192.168.1.10") + '[nodes.env]\nMLX_METAL_FAST_SYNCH = "1"\n'
    )
    spec, warnings = check_cluster_file(write(tmp_path, text))
    assert {warning.path for warning in warnings} == {
        "nodes[1].env.MLX_METAL_FAST_SYNCH",
        "nodes[1].python",
    }
    assert "deadlock and leave the GPU wedged" in warnings[0].message + warnings[1].message
    assert "MLX_METAL_FAST_SYNCH" not in build_plan(spec, "L1").ranks[0].env
    ring = RING_OF_THREE.replace("10.0.1.1", "192.168.1.1")
    _spec, warnings = check_cluster_file(write(tmp_path, ring))
    assert [warning.path for warning in warnings] == ["links[0].ips[0]"]
    assert all(warning.severity == "warning" for warning in warnings)


def test_rdma_own_index_becomes_null(tmp_path: Path) -> None:
    """ "" in an rdma list stands for TOML's missing null at the node's own index."""
    spec = load_cluster(write(tmp_path, JACCL_PAIR))
    assert spec.nodes[0].rdma == [None, "rdma_en3"]
    assert spec.nodes[1].rdma == ["rdma_en3", None]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "orchestrator.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_cli_validate_summarises_valid_file() -> None:
    """`orchestrator validate` exits 0 with nodes, backend, ranks and model."""
    result = run_cli("validate", str(ROOT / "cluster.toml.example"))
    assert result.returncode == 0, result.stderr
    assert "ring backend, 2 ranks (pipeline parallel)" in result.stdout
    assert "bundled:smollm2-135m-instruct" in result.stdout
    assert "127.0.0.1:52101" in result.stdout


@pytest.mark.parametrize(("nodes", "parallel", "said"), [
    (1, "auto", "1 rank (one rank, the whole model)"),
    (2, "auto", "2 ranks (tensor or pipeline parallel: `orchestrator plan` decides"),
    (3, "tensor", "3 ranks (tensor parallel)"),
])
def test_cli_validate_says_the_mode_the_file_decides(
    tmp_path: Path, nodes: int, parallel: str, said: str
) -> None:
    """validate names the parallelism the file fixes, or says that plan decides it."""
    text = f'[cluster]\nparallel = "{parallel}"\n'
    text += "".join(f'[[nodes]]\nname = "n{i}"\nip = "127.0.0.1"\n' for i in range(nodes))
    result = run_cli("validate", str(write(tmp_path, text)))
    assert said in result.stdout, result.stdout + result.stderr


def test_cli_validate_lists_errors_with_exit_2(tmp_path: Path) -> None:
    """`orchestrator validate` on a broken file exits 2 naming the file and each field."""
    path = write(tmp_path, LOCAL_NODE + "[api]\nport = 0\nhots = 'x'\n")
    result = run_cli("validate", str(path))
    assert result.returncode == 2
    assert f"{path}: 2 errors" in result.stderr
    assert f"{path}: api.port" in result.stderr
    assert "did you mean 'host'" in result.stderr


def test_ring_links_give_each_rank_its_address_towards_the_previous_node(tmp_path: Path) -> None:
    """Rank i listens on node i's address on the cable to node i-1, as MLX's ring expects."""
    spec = load_cluster(write(tmp_path, RING_OF_THREE))
    plan = build_plan(spec, "L1")
    hostfile = json.loads(plan.ranks[0].files["hostfile.json"])
    assert hostfile == [["10.0.3.1:52100"], ["10.0.1.2:52101"], ["10.0.2.2:52102"]]
    connections = [(hop.src, hop.dst, hop.address.ip, hop.address.field) for hop in hops(spec)]
    assert connections == [
        (2, 0, "10.0.3.1", "links[2].ips[1]"),
        (0, 1, "10.0.1.2", "links[0].ips[1]"),
        (1, 2, "10.0.2.2", "links[1].ips[1]"),
    ]


def test_ranks_sharing_a_kernel_are_told_how_many_share_it(tmp_path: Path) -> None:
    """Nodes with one boot_id (namespaces of one machine) split its cores: each rank's env
    says how many ranks run there; a node of unknown boot_id gets no count."""
    spec = load_cluster(write(tmp_path, RING_OF_THREE))
    here = collect_fingerprint(None, None)

    def on(**boot_ids: str | None) -> dict[str, NodeFingerprint]:
        return {name: msgspec.structs.replace(here, boot_id=b) for name, b in boot_ids.items()}

    plan = build_plan(spec, "L1", on(a="k1", b=None, c="k1"))
    shared = [rank.env.get("ORCHESTRATOR_RANKS_ON_MACHINE") for rank in plan.ranks]
    assert shared == ["2", None, "2"]
    alone = build_plan(spec, "L1", on(a="k1", b="k2", c="k3"))
    assert [rank.env["ORCHESTRATOR_RANKS_ON_MACHINE"] for rank in alone.ranks] == ["1"] * 3
    assert "ORCHESTRATOR_RANKS_ON_MACHINE" not in build_plan(spec, "L1").ranks[0].env


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'[[nodes]]\nname = "caf\xe9"\n', "is not UTF-8 text (byte 0xe9 on line 2)"),
        (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "arrays or tables are nested too deeply"),
        (b"# " + b"x" * (1 << 20) + b"\n", "is larger than 1024 KiB"),
    ],
    ids=["not utf-8", "too deep", "too large"],
)
def test_unreadable_files_are_one_clear_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """Bytes that are not a cluster.toml: exit 2 naming the file and why, no traceback."""
    path = tmp_path / "cluster.toml"
    path.write_bytes(content)
    result = run_cli("validate", str(path))
    assert result.returncode == 2
    assert f"{path}: {message}" in result.stderr and "Traceback" not in result.stderr


def test_all_interfaces_without_a_key_warns(tmp_path: Path) -> None:
    """api.host 0.0.0.0 with no API key is allowed, with a warning naming the fix."""
    config = write(tmp_path, LOCAL_NODE + "[api]\nhost = '0.0.0.0'\n")
    _spec, warnings = check_cluster_file(config)
    assert [(w.path, w.severity) for w in warnings] == [("api.host", "warning")]
    assert "api_key_env" in warnings[0].fix


def test_missing_identity_file_warns_here_and_is_named_at_connect(tmp_path: Path) -> None:
    """validate warns (another machine may have the key); connecting names field and file."""
    text = '[[nodes]]\nname = "a"\ntransport = "ssh"\nssh = "me@127.0.0.1"\npython = "python3"\n'
    spec, warnings = check_cluster_file(write(tmp_path, text + 'identity_file = "/nope/id"\n'))
    assert [(w.path, w.severity) for w in warnings] == [("nodes[0].identity_file", "warning")]
    with pytest.raises(TransportError) as caught:
        asyncio.run(SshTransport(spec.nodes[0], connect_timeout=5).connect())
    assert caught.value.kind == ErrorKind.CONFIG and "identity_file /nope/id" in str(caught.value)


def test_hub_model_validates_and_is_served_by_its_name(tmp_path: Path) -> None:
    """hf:ORG/NAME@REV with a store is valid; clients call it NAME."""
    text = LOCAL_NODE + '[model]\npath = "hf:mlx-community/Qwen3-30B-A3B-4bit@v1"\nstore = "~/m"\n'
    spec, warnings = check_cluster_file(write(tmp_path, text))
    assert spec.model.served_id == "Qwen3-30B-A3B-4bit"
    assert spec.model.store == "~/m" and not warnings


def test_kv_bits_accepted(tmp_path: Path) -> None:
    """[serving] kv_bits and kv_group_size reach the spec (the quantized KV cache)."""
    text = LOCAL_NODE + "[serving]\nkv_bits = 4\nkv_group_size = 32\n"
    spec = load_cluster(write(tmp_path, text))
    assert (spec.serving.kv_bits, spec.serving.kv_group_size) == (4, 32)
