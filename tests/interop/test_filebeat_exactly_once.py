"""The real Filebeat 7.17.29 ships a 60,000-line file to the real daemon's lumberjack source
across two kill -9s of the router, and every line lands in the lake exactly once.

Filebeat reaches the router through ``AckGate``: before each kill the gate throws away the
router's acks until one that acknowledges stored events is among them, so windows are surely
stored whose acks Filebeat never gets (a router killed just after writing its acks). Filebeat
sends those events again to the restarted router, which must recognise them by their keys
(``agent.ephemeral_id``, ``log.file.path``, ``log.offset``, ``@timestamp``) and ack them
without storing them twice. Skipped, saying why, where Filebeat cannot be built (no Go, the
module proxy refuses it); ``tests/filebeat.py`` builds it once per machine.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

import filebeat as filebeat_harness
from ack_gate import AckGate
from daemon import Daemon
from helpers import read_lake, scrape, wait_until
from logrouter.wire import lumberjack as lj
from logrouter.wire.errors import DecodeError

LINES = 60_000
# Lines written at the start, then before each kill (the router stores them while its acks
# are thrown away), then at the end.
WRITES = (20_000, 10_000, 10_000, 20_000)


CONFIG = """
[router]
workers = 1
metrics_listen = "tcp:0:interface=127.0.0.1"

[spool]
path = "spool"

[sources.beats]
type = "lumberjack"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["beats"]
path = "lake"
roll_secs = 3600
"""


@pytest.fixture(scope="module")
def filebeat_bin() -> Path:
    path = filebeat_harness.ensure_built()
    if path is None:
        pytest.skip(filebeat_harness.build_reason())
    return path


def counters(port: int) -> tuple[float, float]:
    """Events the router stored in this run, and events it recognised as stored before."""
    values = scrape(port)
    return values.get("logrouter_events_in_total", 0.0), values.get("logrouter_duplicate_events_total", 0.0)


def spool_bytes(port: int) -> tuple[float, float]:
    """Events the router's beats source stored in this run, and their spool bytes."""
    values = scrape(port)
    events = sum(v for k, v in values.items() if k.startswith("logrouter_source_events_total{") and '"beats"' in k)
    size = sum(v for k, v in values.items() if k.startswith("logrouter_source_bytes_total{") and '"beats"' in k)
    return events, size


def lost_ack(gate: AckGate) -> bool:
    """The gate threw away an ack of stored events (not only ACK 0 keepalives)."""
    try:
        return any(ack.seq for ack in lj.AckDecoder().feed(gate.dropped))
    except DecodeError as e:  # a frame cut where two connections' drops meet
        return any(ack.seq for ack in e.messages)


def start_router(workdir: Path, gate: AckGate, stack: contextlib.ExitStack, daemons: list[Daemon]) -> tuple[Daemon, int]:
    """A router run (killed at the end of the test if still running) behind ``gate``."""
    daemon = stack.enter_context(Daemon(workdir, CONFIG))
    daemons.append(daemon)
    daemon.start()
    gate.target = daemon.port("beats")
    metrics = int(daemon.wait_for(r"metrics listening on \S+ port (\d+)").group(1))
    return daemon, metrics


def line(n: int) -> str:
    return f"line {n:06d} {'x' * 40}"


@pytest.mark.parametrize("processors", [[], [{"add_id": {}}]], ids=["line-keys", "add_id"])
def test_filebeat_lines_land_once_across_two_router_kills(filebeat_bin, tmp_path, processors):
    """Without processors the events are named by their line fields; with ``add_id`` by
    ``@metadata._id``."""
    log_file = tmp_path / "app.log"
    written = 0

    def write(count: int) -> None:
        nonlocal written
        with open(log_file, "a") as f:
            f.writelines(f"{line(n)}\n" for n in range(written, written + count))
        written += count

    write(WRITES[0])
    duplicates = 0.0
    daemons: list[Daemon] = []
    with contextlib.ExitStack() as stack:  # on the way out: Filebeat stopped, routers killed, gate closed
        gate = stack.enter_context(AckGate())
        daemon, metrics = start_router(tmp_path, gate, stack, daemons)
        beat = stack.enter_context(filebeat_harness.Filebeat(
            filebeat_bin, tmp_path / "filebeat", [log_file], [f"127.0.0.1:{gate.port}"],
            output={"timeout": 30, "backoff.init": "200ms", "backoff.max": "1s"},
            input={"backoff": "100ms", "max_backoff": "500ms"},
            processors=processors,
        ))
        try:
            beat.start()
            for kill in (1, 2):
                wait_until(lambda: counters(metrics)[0] >= (5000 if kill == 1 else 1), 180,
                           f"the router storing events before kill {kill}")
                gate.hold()
                write(WRITES[kill])  # something to send, in case Filebeat had caught up
                wait_until(lambda: lost_ack(gate), 60, "an ack of stored events thrown away")
                duplicates += counters(metrics)[1]  # what this run recognised so far
                daemon.kill()
                gate.cut()
                gate.release()
                assert beat.running(), beat.output()
                daemon, metrics = start_router(tmp_path, gate, stack, daemons)
            write(WRITES[3])
            size = log_file.stat().st_size
            wait_until(lambda: beat.acked_offset(log_file) >= size, 300,
                       "Filebeat's registry to have every line acknowledged")
            duplicates += counters(metrics)[1]
            stored_events, stored_bytes = spool_bytes(metrics)
        except BaseException:
            print(beat.output())
            for run, each in enumerate(daemons, 1):
                print(f"-- router run {run}:\n" + "".join(each.lines[-60:]))
            raise
        beat.stop()
        daemon.stop_gracefully()
    assert written == LINES
    rows = read_lake(tmp_path / "lake")
    messages = [row["message"] for row in rows]
    ids = {json.loads(row["_extra"])["@metadata"].get("_id") for row in rows[:100]}
    assert (None in ids) == (not processors)  # the key add_id gives reached the router
    counts: dict[str, int] = {}
    for message in messages:
        counts[message] = counts.get(message, 0) + 1
    twice = sum(1 for c in counts.values() if c > 1)
    missing = LINES - len(counts)
    assert (missing, twice, len(messages)) == (0, 0, LINES), f"{missing} lines missing, {twice} stored more than once"
    assert sorted(counts) == [line(n) for n in range(LINES)]
    assert gate.dropped_bytes > 0 and duplicates > 0  # acks were lost, and the resends recognised
    # The spool stored the windows compressed, as Filebeat sent them (lumberjack-zlib): its
    # events' JSON is ~600 bytes each, their records a small part of that; and the last
    # run, a restart, replayed the records the kill left uncommitted into the lake.
    assert stored_bytes < 300 * stored_events, (stored_bytes, stored_events)
