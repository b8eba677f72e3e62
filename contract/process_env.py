"""The environment an agent or a rank starts with: what it needs, named, and nothing else.

The orchestrator's own environment holds secrets (the API key, HF_TOKEN, cloud and SSH
credentials) that no rank needs; a model's code or a rank's crash dump must not see them.
So a local agent is started with `passed_env(os.environ)`, and every agent starts its
ranks from `passed_env(its own environment)` plus what the launch sets
(contract/rank_env.py) and a node's `[nodes.env]`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from contract import rank_env

# The process's basics: finding programs and the home directory, locale, temp files.
_SYSTEM = {
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TMPDIR", "TERM",
    "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
    "__CF_USER_TEXT_ENCODING", "OBJC_DISABLE_INITIALIZE_FORK_SAFETY",  # macOS
    "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "DYLD_FALLBACK_LIBRARY_PATH",  # a BLAS's library
}
# Python and the libraries a rank loads: its venv, the hub cache (offline: ranks never
# reach the hub, so no endpoint and no token), the tokenizers, the BLAS thread counts.
_PYTHON = {
    "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "PYTHONFAULTHANDLER", "PYTHONWARNINGS", "VIRTUAL_ENV",
    "COVERAGE_PROCESS_START", "COVERAGE_FILE",
    "HF_HOME", "HF_HUB_CACHE", rank_env.HF_HUB_OFFLINE, "TOKENIZERS_PARALLELISM",
    "VECLIB_MAXIMUM_THREADS",
}
# The orchestrator's own: caches and the variables tests steer ranks with.
_OURS = {
    rank_env.STANDBY, rank_env.FAULT, rank_env.FAULT_FILE, rank_env.BLAS,
    rank_env.RANKS_ON_MACHINE, rank_env.FORCED_OUTPUT,
    "ORCHESTRATOR_MODEL_CACHE", "ORCHESTRATOR_HASH_CACHE", "ORCHESTRATOR_TEST_ARTIFACTS",
}
PASSED_NAMES = frozenset(_SYSTEM | _PYTHON | _OURS)
# Whole families: the locale, MLX's and Metal's switches, the BLAS's and OpenMP's.
PASSED_PREFIXES = ("LC_", "MLX_", "MTL_", "OPENBLAS_", "OMP_", "MKL_", "GOTO_")
# Never passed, whatever their names (a key variable could be named MLX_KEY).
NEVER = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})


def passed_env(environ: Mapping[str, str], secrets: Collection[str] = ()) -> dict[str, str]:
    """The variables of `environ` an agent or a rank may have; `secrets`: names dropped
    even when they would pass (the API key's variable)."""
    return {
        name: value
        for name, value in environ.items()
        if name not in NEVER
        and name not in secrets
        and (name in PASSED_NAMES or name.startswith(PASSED_PREFIXES))
    }
