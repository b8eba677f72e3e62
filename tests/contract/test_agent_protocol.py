"""contract/agent_protocol.py: one JSON object per line, a tagged union on `type`."""

from __future__ import annotations

import json
import typing

import msgspec
import msgspec.inspect
import pytest

from contract.agent_protocol import (
    PROTOCOL_VERSION,
    AgentMessage,
    Exited,
    Log,
    Open,
    Request,
    Spawn,
    Stopped,
    decode_agent_message,
    decode_request,
    encode,
    salvage_id,
)


def test_a_message_is_one_line_even_when_its_text_has_newlines() -> None:
    """JSON escapes a rank's multi-line output: the channel stays one message per line."""
    line = encode(Log(rank=1, stream="stderr", line="Traceback\n  File x\r\nError"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_agent_message(line) == Log(
        rank=1, stream="stderr", line="Traceback\n  File x\r\nError"
    )


def test_the_kind_is_in_type_and_defaults_are_left_out() -> None:
    """The tag names the message; fields at their default are not sent."""
    assert json.loads(encode(Open(protocol_version=PROTOCOL_VERSION))) == {
        "type": "open",
        "protocol_version": PROTOCOL_VERSION,
    }


def test_requests_and_agent_messages_round_trip() -> None:
    """What the orchestrator sends the agent decodes unchanged, and the reverse."""
    spawn = Spawn(
        id=7,
        rank=2,
        argv=["python", "-m", "serving"],
        env={"MLX_RANK": "2"},
        files={"settings.json": "{}"},
        standby=True,
    )
    assert decode_request(encode(spawn)) == spawn
    stopped = Stopped(id=8, exits=[Exited(rank=2, pid=99, signal="SIGKILL", stopped=True)])
    assert decode_agent_message(encode(stopped)) == stopped


def test_every_tag_names_one_message() -> None:
    """The unions decode by tag: a tag used twice would decode as the wrong type."""
    members = [*typing.get_args(Request), *typing.get_args(AgentMessage)]
    tags = [msgspec.inspect.type_info(m).tag for m in members]
    assert len(tags) == len(set(tags)), sorted(tags)


def test_a_reply_is_not_a_request_nor_the_reverse() -> None:
    """Each side decodes only what the other may send it."""
    with pytest.raises(msgspec.ValidationError):
        decode_request(encode(Stopped(id=1)))
    with pytest.raises(msgspec.ValidationError):
        decode_agent_message(encode(Open(id=1, protocol_version=PROTOCOL_VERSION)))


@pytest.mark.parametrize(
    ("line", "id_"),
    [
        (b'{"type": "no_such_request", "id": 7}', 7),
        (b'{"type": "spawn", "id": 9, "rank": "not a number"}', 9),
        (b'{"type": "spawn"}', None),
        (b"not json at all", None),
    ],
)
def test_a_bad_requests_id_is_salvaged_to_address_the_error(line: bytes, id_: int | None) -> None:
    """An undecodable request still gets its error addressed by id when it has one."""
    with pytest.raises(msgspec.DecodeError):
        decode_request(line)
    assert salvage_id(line) == id_
