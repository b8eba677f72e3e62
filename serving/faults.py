"""Fault injection: a testing aid for the supervisor, off unless ORCHESTRATOR_FAULT names a fault
(or the file ORCHESTRATOR_FAULT_FILE names does, when the rank starts).

Syntax (several faults separated by ","):

    desync:rank=R:step=N          rank R perturbs its batch fingerprint at step N
    misaccept:rank=R:step=N       rank R counts the drafts it accepts at step N one off
                                  (a speculative step: serving/engine/speculative.py)
    exit:rank=R:step=N[:code=C]   rank R exits with code C (default INJECTED_FAULT) at step N
    hang:rank=R:step=N            rank R stops making progress at step N (sleeps forever)
    exit_on_load:rank=R[:code=C]  rank R exits before loading the model
    hang_on_load:rank=R           rank R never starts loading (an init/load timeout)
    ebusy:rank=R                  rank R prints a JACCL EBUSY error line and fails init
    crash_on:rank=R:text=STRING   rank R exits (code INJECTED_FAULT) when a plan inserts a
                                  request whose prompt, decoded, contains STRING (a request
                                  of death: orchestrator/gateway/quarantine.py); STRING may
                                  not contain "," or ":"

Steps count engine steps (keepalives excluded) from 1.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contract.exit_codes import RankExit
from contract.rank_env import FAULT, FAULT_FILE

KINDS = (
    "desync", "misaccept", "exit", "hang", "exit_on_load", "hang_on_load", "ebusy", "crash_on",
)

# Modelled on MLX's JACCL message when ibv_create_qp fails with EBUSY (mlx PR #4209).
EBUSY_LINE = (
    "RuntimeError: [jaccl] Creating the queue pair failed with errno 16 "
    "(Device or resource busy). Thunderbolt RDMA devices support a limited number "
    "of queue pairs per device and fail here once they are exhausted."
)


def _file_spec() -> str:
    path = os.environ.get(FAULT_FILE)
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return ""


class FaultSpecError(ValueError):
    """ORCHESTRATOR_FAULT could not be parsed."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int | None = None
    code: int | None = None
    text: str | None = None  # crash_on: the prompt text that kills the rank


def parse_faults(text: str) -> list[Fault]:
    """Parse the ORCHESTRATOR_FAULT value into faults."""
    return [_parse_one(part) for part in text.split(",") if part.strip()]


def _parse_one(text: str) -> Fault:
    kind, *fields = text.strip().split(":")
    if kind not in KINDS:
        raise FaultSpecError(f"unknown fault kind {kind!r} in {text!r}; expected one of {KINDS}")
    values: dict[str, int] = {}
    match: str | None = None
    for field in fields:
        key, sep, raw = field.partition("=")
        if key == "text" and sep and raw:
            match = raw
            continue
        if not sep or key not in ("rank", "step", "code") or not raw.lstrip("-").isdigit():
            raise FaultSpecError(f"bad field {field!r} in fault {text!r}")
        values[key] = int(raw)
    if "rank" not in values:
        raise FaultSpecError(f"fault {text!r} needs rank=R")
    if kind in ("desync", "misaccept", "exit", "hang") and "step" not in values:
        raise FaultSpecError(f"fault {text!r} needs step=N")
    if (kind == "crash_on") != (match is not None):
        raise FaultSpecError(f"fault {text!r}: text=STRING goes with crash_on, and only there")
    return Fault(kind, values["rank"], values.get("step"), values.get("code"), match)


class FaultPlan:
    """The faults that apply to this rank; every hook is a no-op when none do."""

    def __init__(self, faults: list[Fault], rank: int) -> None:
        self._faults = [f for f in faults if f.rank == rank]
        # Set once the tokenizer is loaded (serving/rank/startup.py): the plan carries token
        # ids, and crash_on matches text.
        self.decode: Callable[[list[int]], str] | None = None

    @classmethod
    def from_env(cls, rank: int) -> FaultPlan:
        specs = (os.environ.get(FAULT, ""), _file_spec())
        return cls(parse_faults(",".join(filter(None, specs))), rank)

    @property
    def active(self) -> bool:
        return bool(self._faults)

    def on_init(self) -> None:
        """Before distributed init: the EBUSY fault fails here like a real JACCL init."""
        if any(f.kind == "ebusy" for f in self._faults):
            print(EBUSY_LINE, file=sys.stderr, flush=True)
            os._exit(RankExit.DISTRIBUTED_INIT_FAILED)

    def on_load(self) -> None:
        """Before loading the model."""
        for f in self._faults:
            if f.kind == "exit_on_load":
                _exit(f)
            if f.kind == "hang_on_load":
                _hang("before loading")

    def on_step(self, step: int) -> None:
        """At the start of engine step `step` (exit and hang faults)."""
        for f in self._faults:
            if f.step != step:
                continue
            if f.kind == "exit":
                _exit(f)
            if f.kind == "hang":
                _hang(f"at step {step}")

    def on_insert(self, prompts: Sequence[list[int]]) -> None:
        """Before a plan's inserts are applied (every rank sees them): crash_on exits here."""
        texts = [f.text for f in self._faults if f.kind == "crash_on" and f.text]
        if not texts or not prompts or self.decode is None:
            return
        for prompt in prompts:
            decoded = self.decode(prompt)
            if any(text in decoded for text in texts):
                print("[fault] crash_on: a request of death was inserted", file=sys.stderr,
                      flush=True)
                os._exit(RankExit.INJECTED_FAULT)

    def desync_at(self, step: int) -> bool:
        """Whether this rank should perturb its fingerprint at `step`."""
        return any(f.kind == "desync" and f.step == step for f in self._faults)

    def misaccept_at(self, step: int) -> bool:
        """Whether this rank should count its accepted drafts wrong at `step`."""
        return any(f.kind == "misaccept" and f.step == step for f in self._faults)


def _hang(where: str) -> None:
    print(f"[fault] hanging {where}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def _exit(fault: Fault) -> None:
    code = RankExit.INJECTED_FAULT if fault.code is None else fault.code
    print(f"[fault] injected exit with code {code}", file=sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(code)
