"""The isolation gate: a suspect runs alone and before ordinary requests; rank 0's answers
that mean "your request was at rank 0 when the engine failed"."""

from __future__ import annotations

import asyncio

import pytest

from contract.anthropic_schemas import error_payload
from contract.openai_errors import ApiError
from orchestrator.gateway.proxy import engine_failed
from orchestrator.gateway.quarantine import IsolationGate, request_of_death


async def _hold(gate: IsolationGate, isolated: bool, log: list[str], name: str,
                release: asyncio.Event) -> None:
    async with gate.isolated() if isolated else gate.ordinary():
        log.append(f"+{name}")
        await release.wait()
        log.append(f"-{name}")


def test_suspect_runs_alone_and_before_later_ordinary_requests() -> None:
    """A suspect waits for the ordinary requests at rank 0, then has it alone; an ordinary
    request that arrives meanwhile waits for the suspect."""

    async def run() -> list[str]:
        gate, log = IsolationGate(), []
        first, suspect, later = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(_hold(gate, False, log, "a", first))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(_hold(gate, True, log, "s", suspect)))
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(_hold(gate, False, log, "b", later)))
        await asyncio.sleep(0.01)
        assert log == ["+a"] and gate.suspects_waiting == 1
        first.set()
        await asyncio.sleep(0.01)
        assert log == ["+a", "-a", "+s"]
        suspect.set()
        later.set()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(run()) == ["+a", "-a", "+s", "-s", "+b", "-b"]


def test_suspects_run_one_at_a_time() -> None:
    """Two suspects never share rank 0."""

    async def run() -> list[str]:
        gate, log, go = IsolationGate(), [], asyncio.Event()
        tasks = [asyncio.create_task(_hold(gate, True, log, n, go)) for n in ("s", "t")]
        await asyncio.sleep(0.01)
        assert log == ["+s"]
        go.set()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(run()) == ["+s", "-s", "+t", "-t"]


@pytest.mark.parametrize(
    ("body", "taken"),
    [
        (b'{"error":{"message":"engine failed: connection to a peer rank was lost",'
         b'"type":"server_error","code":"engine_error"}}', True),
        (b'{"type":"error","error":{"type":"overloaded_error",'
         b'"message":"engine failed: unexpected internal error"}}', True),
        (b'{"error":{"message":"server is shutting down","type":"server_error",'
         b'"code":"shutdown"}}', True),
        (b'{"error":{"message":"model is stopping","type":"server_error",'
         b'"code":"service_unavailable"}}', False),
        (b"not json", False),
    ],
)
def test_engine_failed_tells_taken_from_refused(body: bytes, taken: bool) -> None:
    """Rank 0's 503 for a request it held (a suspect) vs one it refused at the door."""
    assert engine_failed(body) is taken


def test_request_of_death_error_in_both_shapes() -> None:
    """A 500 saying the request crashed the model server, with the cause, in each API's shape."""
    error = request_of_death("rank_crashed: rank 1 on b: injected_fault")
    assert isinstance(error, ApiError) and error.status == 500
    openai = error_payload(error, "/v1/chat/completions")
    assert openai.error.code == "request_crashed_server"  # type: ignore[attr-defined]
    assert "crashed the model server" in openai.error.message  # type: ignore[attr-defined]
    anthropic = error_payload(error, "/v1/messages")
    assert anthropic.error.type == "api_error"  # type: ignore[attr-defined]
    assert "rank 1 on b" in anthropic.error.message  # type: ignore[attr-defined]
