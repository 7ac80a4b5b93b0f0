#!/usr/bin/env python3
"""Per-event cost of the lumberjack source's idempotency keys, in µs/event.

Run by hand: ``.venv/bin/python bench/beats_keys.py`` (a few seconds). Events are shaped as
Filebeat 7.17's log input sends them (``agent``, ``log.offset``/``log.file.path``,
``@timestamp``, ``@metadata``, a ~100-byte ``message``), in windows of 2048 (Beats'
``bulk_max_size``). Each line is the best of ``--runs`` runs over ``--windows`` windows,
divided by the event count:

- ``decode + batches``: what the source did per event before keys, for scale: the codec
  decoding a compressed window and ``batch_builder`` making the batch;
- ``keys (auto, line)``: ``idempotency_key = "auto"`` on events without ``@metadata._id``
  (the line's four fields hashed);
- ``keys (auto, _id)``: the same with ``@metadata._id`` set (``add_id``);
- ``window claim + finish``: the router's side: sorting a window's keys against the
  sender's window, then entering them (new events, a window holding 8192 already);
- ``window claim, all resent``: a window whose every event is already stored.

The machine is shared: compare lines of one run, not runs of different hours.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logrouter import dedupe  # noqa: E402
from logrouter.sources.event_keys import key_maker  # noqa: E402
from logrouter.sources.events import TagTemplate, batch_builder  # noqa: E402
from logrouter.wire import lumberjack as lj  # noqa: E402

WINDOW = 2048
AGENT = str(uuid.UUID(int=1))
EPHEMERAL = str(uuid.UUID(int=2))


def event(i: int, with_id: bool) -> dict:
    record = {
        "@timestamp": "2026-11-27T03:54:%02d.%03dZ" % (i // 1000 % 60, i % 1000),
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "7.17.29"},
        "agent": {"id": AGENT, "name": "web-01", "type": "filebeat", "version": "7.17.29",
                  "hostname": "web-01", "ephemeral_id": EPHEMERAL},
        "ecs": {"version": "1.12.0"},
        "host": {"name": "web-01"},
        "input": {"type": "log"},
        "log": {"offset": 100 * i, "file": {"path": "/var/log/nginx/access.log"}},
        "message": "10.0.%d.%d - - [27/Nov/2026:03:54:32 +0000] \"GET /api/items/%06d HTTP/1.1\" 200 512" % (
            i % 256, i // 256 % 256, i),
    }
    if with_id:
        record["@metadata"]["_id"] = "%020d" % i
    return record


def best(runs: int, work, events: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return min(times) / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    n = args.windows * WINDOW
    windows = [[event(w * WINDOW + i, False) for i in range(WINDOW)] for w in range(args.windows)]
    with_ids = [[event(w * WINDOW + i, True) for i in range(WINDOW)] for w in range(args.windows)]
    frames = [lj.encode_window_frames(records) for records in windows]
    batches = batch_builder(TagTemplate("beats"))
    auto = key_maker("auto")

    def decode() -> None:
        for data in frames:
            for message in lj.LumberjackDecoder().feed(data):
                if isinstance(message, lj.Events):
                    batches(message.records, 0, message.documents)

    def keys(source: list[list[dict]]):
        return lambda: [auto(records) for records in source]

    line_keys = keys(windows)()
    state: dict = {}

    def claim_new() -> None:
        w = dedupe.EventWindows(lambda source: (8192, 128))
        for k in line_keys:
            w.claim("beats", k).finish(0)
        state["windows"] = w

    def claim_resent() -> None:
        w = state["windows"]
        for k in line_keys[-4:]:
            w.claim("beats", k)

    print(f"{n:,} events in windows of {WINDOW}, best of {args.runs} (µs/event):")
    print(f"  decode + batches           {best(args.runs, decode, n):6.2f}")
    print(f"  keys (auto, line)          {best(args.runs, keys(windows), n):6.2f}")
    print(f"  keys (auto, _id)           {best(args.runs, keys(with_ids), n):6.2f}")
    print(f"  window claim + finish      {best(args.runs, claim_new, n):6.2f}")
    print(f"  window claim, all resent   {best(args.runs, claim_resent, 4 * WINDOW):6.2f}")


if __name__ == "__main__":
    main()
