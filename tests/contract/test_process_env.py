"""The environment agents and ranks start with: what they need, never a secret."""

from __future__ import annotations

from contract import rank_env
from contract.process_env import passed_env


def test_secrets_stay_behind_what_ranks_need_passes() -> None:
    """HF_TOKEN, an API key, cloud and SSH credentials are dropped; PATH, HOME, MLX's and
    the BLAS's switches, the hub cache and the tests' fault variables pass."""
    needed = {
        "PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C",
        "MLX_METAL_FAST_SYNCH": "0", "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2",
        "HF_HUB_CACHE": "/hub", "VIRTUAL_ENV": "/venv", rank_env.FAULT: "hang@step:3",
        rank_env.FAULT_FILE: "/tmp/faults", "PYTHONPATH": "/code",
    }
    secret = {
        "HF_TOKEN": "hf_x", "HUGGING_FACE_HUB_TOKEN": "hf_y", "ORCHESTRATOR_API_KEY": "k",
        "AWS_SECRET_ACCESS_KEY": "a", "SSH_AUTH_SOCK": "/tmp/agent", "GITHUB_TOKEN": "g",
        "HF_ENDPOINT": "https://mirror",
    }
    assert passed_env({**needed, **secret}) == needed
    assert passed_env({"MLX_KEY": "k", "PATH": "/bin"}, secrets={"MLX_KEY"}) == {"PATH": "/bin"}
