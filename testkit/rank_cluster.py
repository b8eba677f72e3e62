"""Start real serving ranks on 127.0.0.1 over MLX's ring backend (a test and bench helper).

Each rank is `python -m serving --settings FILE` with MLX_RANK + MLX_HOSTFILE, in its
own session, output to a log file (no relay thread). stop() ends every process group
by PID: SIGTERM, then SIGKILL after a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contract import rank_env
from contract.settings import ModelSettings, RankSettings, ServingSettings, dump_settings
from testkit.ports import free_ports
from testkit.waiting import wait_healthy

REPO = Path(__file__).resolve().parents[1]


@dataclass
class RankCluster:
    workdir: Path
    settings: RankSettings
    world_size: int
    launch_id: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.serving.rank_api_port}"

    def log_path(self, rank: int) -> Path:
        return self.workdir / f"rank{rank}.log"

    def log_text(self, rank: int) -> str:
        path = self.log_path(rank)
        return path.read_text(errors="replace") if path.exists() else ""

    def start(
        self, env_extra: dict[str, str] | None = None,
        rank_env_extra: Sequence[dict[str, str]] = (),
    ) -> None:
        settings_file = self.workdir / rank_env.SETTINGS_FILE
        dump_settings(self.settings, settings_file)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
        env[rank_env.LAUNCH_ID] = self.launch_id
        env.update(env_extra or {})
        if self.world_size > 1:
            hostfile = self.workdir / rank_env.HOSTFILE_NAME
            ports = free_ports(self.world_size)
            hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ports]))
            env[rank_env.HOSTFILE] = str(hostfile)
        for rank in range(self.world_size):
            one = {**env, rank_env.RANK: str(rank)} if self.world_size > 1 else env
            if rank < len(rank_env_extra):
                one = {**one, **rank_env_extra[rank]}
            with self.log_path(rank).open("wb") as log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "serving", "--settings", str(settings_file)],
                        cwd=REPO,
                        env=one,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until /health says 200; fails early if any rank exits."""
        if not wait_healthy(self.base_url, timeout, self._check_ranks_alive):
            raise TimeoutError(f"cluster not ready after {timeout} s:\n{self.log_text(0)[-3000:]}")

    def _check_ranks_alive(self) -> None:
        for rank, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise RuntimeError(f"rank {rank} exited with {proc.returncode}:\n"
                                   f"{self.log_text(rank)[-3000:]}")

    def wait_exit(self, rank: int, timeout: float) -> int | None:
        """The rank's exit code, or None if it is still running after timeout."""
        try:
            return self.procs[rank].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every rank's process group, then SIGKILL what is left."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.1))
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group may hold children too
            proc.wait()


@contextlib.contextmanager
def rank_cluster(
    workdir: Path,
    model_dir: Path,
    world_size: int,
    env: dict[str, str] | None = None,
    wait: bool = True,
    served_model_id: str | None = None,
    pipeline_split: list[int] | None = None,
    rank_env_extra: Sequence[dict[str, str]] = (),
    stop_grace: float = 10.0,
    **serving: object,
) -> Iterator[RankCluster]:
    """A running cluster for the duration of the block; always stopped afterwards.

    `rank_env_extra[i]` adds to rank i's environment only; `serving` holds ServingSettings
    fields (max_batch_size=..., keepalive_s=...); `pipeline_split`: layers per rank for
    pipeline parallelism (else tensor); `stop_grace`: seconds from SIGTERM to SIGKILL at
    the end (short where a rank is hung on purpose and would only wait it out)."""
    workdir.mkdir(parents=True, exist_ok=True)
    settings = RankSettings(
        model=ModelSettings(path=str(model_dir), id=served_model_id),
        serving=ServingSettings(rank_api_port=free_ports(1)[0], **serving),  # type: ignore[arg-type]
        pipeline_split=pipeline_split,
    )
    cluster = RankCluster(workdir, settings, world_size, f"test-{world_size}r")
    try:
        cluster.start(env, rank_env_extra)
        if wait:
            cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop(stop_grace)
