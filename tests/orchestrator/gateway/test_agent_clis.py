"""Claude Code, Codex CLI and OpenCode, unmodified, against one rank behind the gateway:
each answers a one-shot prompt and reaches nothing but the gateway.

The rank serves the tiny random Llama of the bundled model's tokenizer and chat template
(tests/model_fixtures.py): the agents' prompts (system, tools, environment) run to
5,000-13,000 tokens, which the bundled model itself takes minutes to read at one rank on a
2-core CI machine (bench/agent_turns.py), the tiny one a second or two. The requests, the
template, the APIs and the gateway are the same. Rank 0 is made to answer ANSWER then end
(the test aid rank_env.FORCED_OUTPUT, through the real sampling path): a random model's
answer never ends, and an answer cut at max_tokens is an error to Claude Code and Codex."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from contract.rank_env import FORCED_OUTPUT
from testkit import agent_clis
from testkit.orchestrator_process import running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
MODEL = "tiny-agent-model"
KEY = "clients-test-key"
KEY_ENV = "CLIENTS_TEST_API_KEY"
# The agents' prompts run to ~13,000 tokens (Claude Code's), beyond the bundled model's own
# 8,192; short answers keep the decode cheap.
WINDOW = 32_768
ANSWER_TOKENS = 32
PROMPT = "Reply with one word: hello"
ANSWER = "hello"
CLI_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Gateway:
    url: str
    address: tuple[str, int]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Gateway]:
    """One local rank of the tiny model, behind a key, its window raised."""
    agent_clis.require()
    tmp = tmp_path_factory.mktemp("clients")
    config = write_cluster(
        tmp, str(tiny_model_dir), [{"name": "a", "env": {FORCED_OUTPUT: ANSWER}}],
        supervisor={"standby_ranks": False},
        model={"context_length": WINDOW, "id": MODEL},
        api={"api_key_env": KEY_ENV},
        serving={"max_tokens_limit": ANSWER_TOKENS, "max_tokens_default": ANSWER_TOKENS},
    )
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, env={KEY_ENV: KEY}, url=url):
        yield Gateway(url, (api["host"], api["port"]))


def answered_through_gateway_only(run: agent_clis.Run, gateway: Gateway) -> None:
    """Exit 0, the answer on stdout, and no connection attempt but to the gateway."""
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    assert ANSWER in run.stdout, (run.stdout[-2000:], run.stderr[-4000:])
    assert gateway.address in run.destinations, run.destinations
    assert run.outside(gateway.address) == [], run.destinations


def test_claude_code_print_mode(gateway: Gateway, tmp_path: Path) -> None:
    """`claude -p` answers, with no unknown-model window warning once the window is set."""
    env = agent_clis.claude(tmp_path / "home", gateway.url, KEY, MODEL, WINDOW)
    run = agent_clis.run(agent_clis.command("claude", PROMPT), env, tmp_path / "work",
                         CLI_TIMEOUT_S)
    answered_through_gateway_only(run, gateway)
    assert "doesn't recognize the model" not in run.stderr


def test_codex_exec(gateway: Gateway, tmp_path: Path) -> None:
    """`codex exec` answers over the Responses API."""
    env = agent_clis.codex(tmp_path / "home", gateway.url, KEY, MODEL)
    run = agent_clis.run(agent_clis.command("codex", PROMPT), env, tmp_path / "work",
                         CLI_TIMEOUT_S)
    answered_through_gateway_only(run, gateway)


def test_opencode_run(gateway: Gateway, tmp_path: Path) -> None:
    """`opencode run` answers over chat completions."""
    env = agent_clis.opencode(tmp_path / "home", gateway.url, KEY, MODEL, WINDOW,
                              ANSWER_TOKENS)
    run = agent_clis.run(agent_clis.command("opencode", PROMPT), env, tmp_path / "work",
                         CLI_TIMEOUT_S)
    answered_through_gateway_only(run, gateway)
