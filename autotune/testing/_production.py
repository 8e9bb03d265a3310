"""Play production: one server runs a deployed config on a stretch of traffic while its /metrics
are scraped, as a gateway's metrics pipeline would. The result is the telemetry bundle that
``production.telemetry`` (the fidelity gate), ``drift check`` and ``recommend check`` read.

For tests and benchmarks of the trust stage against a real engine; the tuner never starts
production itself.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Sequence

from autotune.engines._engine import VllmServer
from autotune.replay import _replay
from autotune.traffic._replayset import ReplayRequest
from autotune.trust import _telemetry as tel


def play_production(argv: list[str], port: int, model: str, warmup: Sequence[ReplayRequest],
                    window: Sequence[ReplayRequest], out: Path, *, env: dict | None = None,
                    concurrency: int = 4, log_path: Path | None = None, start_timeout_s: float = 300.0) -> Path:
    """Start the server (``argv`` from ``build_argv``), send ``warmup``, then serve ``window`` at
    ``concurrency`` while scraping; the traffic starts after the window's first exposition, so the
    bundle's counters cover it whole. Returns the saved bundle (``out``)."""
    out = Path(out)
    with VllmServer(argv=argv, port=port, log_path=log_path or out.with_suffix(".log"), env=env or {},
                    start_timeout_s=start_timeout_s) as srv:
        asyncio.run(_replay.run_closed_loop(srv.base_url, model, warmup, concurrency))
        done = threading.Event()

        def serve():
            try:
                asyncio.run(_replay.run_closed_loop(srv.base_url, model, window, concurrency))
            finally:
                done.set()

        th = threading.Thread(target=serve)

        def traffic_after_first_scrape(_sample):
            if not th.is_alive() and not done.is_set():
                th.start()

        bundle = tel.scrape_window(srv.base_url, 900, sample_every_s=0.5, stop_when=done.is_set,
                                   on_sample=traffic_after_first_scrape)
        th.join()
    return tel.save(out, bundle)
