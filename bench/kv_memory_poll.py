"""What a rank's /metrics says about memory while a load runs (bench/kv_cache.py's memory
phase): the KV bytes admission holds per rank (serving_kv_cache_bytes), and rank 0's MLX
allocator (serving_mlx_active_memory_bytes, serving_mlx_peak_memory_bytes), polled."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

KV = "serving_kv_cache_bytes"
ACTIVE = "serving_mlx_active_memory_bytes"
PEAK = "serving_mlx_peak_memory_bytes"


def read(url: str, client: httpx.Client) -> dict[str, float]:
    """This scrape's KV bytes per rank (`KV{rank=R}`) and MLX's active and peak bytes."""
    out: dict[str, float] = {}
    for line in client.get(url + "/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith((KV + "{", ACTIVE, PEAK)):
            out[name.replace('"', "")] = float(value)
    return out


class Poller:
    """Scrapes /metrics every `every_s` seconds in a thread until stopped; keeps each
    series' maximum and the samples (time, MLX active, KV bytes of rank 0)."""

    def __init__(self, url: str, every_s: float = 0.5) -> None:
        self.url, self.every_s = url, every_s
        self.maxima: dict[str, float] = {}
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        start = time.monotonic()
        with httpx.Client(timeout=30) as client:
            while not self._stop.wait(self.every_s):
                try:
                    got = read(self.url, client)
                except httpx.HTTPError:
                    continue
                for key, value in got.items():
                    self.maxima[key] = max(value, self.maxima.get(key, 0.0))
                self.samples.append((round(time.monotonic() - start, 1), got.get(ACTIVE, 0.0),
                                     got.get(KV + "{rank=0}", 0.0)))
