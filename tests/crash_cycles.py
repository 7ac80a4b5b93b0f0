"""Crash cycles against the real daemon: start it, load it, kill it at a random moment, again.

Shared by the crash tests of the lake sinks. ``run_cycles`` runs one daemon per entry of
``endings``: ``load`` (a ``chunk_client.Client`` streams chunks, SIGKILL after a random
number of acks plus a random delay, so kills land during appends, fsyncs, file writes and
commits), ``start_kill`` / ``start_term`` (SIGKILL or SIGTERM at a random moment of the
start: spool open, dedupe window read back, sinks replaying), ``stop_kill`` (SIGKILL in
the middle of a graceful stop). ``finish`` then resends everything unacked to a last
daemon and stops it gracefully. Every wait is bounded; loopback only.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

from chunk_client import Client
from daemon import Daemon


def run_cycles(tmp_path: Path, config: str, endings: tuple[str, ...], client: Client, rng: random.Random,
               max_chunks: int = 400, delay: float = 0.15, outputs: list[str] | None = None) -> int:
    """Run the cycles; the number of daemons killed (or stopped while starting). Each
    daemon's log goes into ``outputs`` if given."""
    kills = 0
    daemons: list[Daemon] = []
    for ending in endings:
        with Daemon(tmp_path, config) as daemon:
            daemons.append(daemon)
            if ending.startswith("start_"):
                daemon.start(wait_for="")
                threading.Event().wait(rng.uniform(0.2, 2.0))
                daemon.process.send_signal(signal.SIGKILL if ending == "start_kill" else signal.SIGTERM)
                assert daemon.process.wait(60) in (0, -signal.SIGKILL, -signal.SIGTERM), daemon.output
                assert "Traceback" not in daemon.output, daemon.output
                kills += 1
                continue
            daemon.start()
            port = daemon.port("forward")
            client.acked_this_cycle = 0
            target = rng.randint(3, 40)
            wait = rng.uniform(0, delay)

            def killer() -> None:
                with client.progress:
                    client.progress.wait_for(lambda: client.acked_this_cycle >= target, timeout=60)
                threading.Event().wait(wait)  # a random moment after the target was reached
                if ending == "stop_kill":
                    daemon.process.send_signal(signal.SIGTERM)
                    daemon.wait_for(r"logrouter stopping", timeout=30)
                    threading.Event().wait(rng.uniform(0, 0.3))
                daemon.process.send_signal(signal.SIGKILL)

            thread = threading.Thread(target=killer)
            thread.start()
            client.run(port, max_chunks, time.monotonic() + 120)
            thread.join(90)
            assert daemon.process.wait(30) in (-signal.SIGKILL, -signal.SIGTERM)
            kills += 1
    if outputs is not None:
        outputs.extend(daemon.output for daemon in daemons)
    return kills


def finish(tmp_path: Path, config: str, client: Client) -> Daemon:
    """A last run: everything unacked is resent, then a graceful stop commits the rest."""
    with Daemon(tmp_path, config) as daemon:
        daemon.start()
        client.run(daemon.port("forward"), len(client.unacked) + 5, time.monotonic() + 120)
        assert not client.unacked
        daemon.stop_gracefully()
    return daemon
