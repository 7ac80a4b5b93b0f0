"""A writer of the official Pravega client (PyPI ``pravega``), run as its own process.

The client's blocking calls hold the GIL for their whole network round trip, so it cannot
share a process with anything that must go on meanwhile (the daemon, or a test that kills
the daemon while the writer writes): tests run this file with ``subprocess``.

    python pravega_writer.py --controller tcp://127.0.0.1:9090 --scope sc --stream st \
        --segments 3 --first 0 --count 1000 --keys 20 --inflight 100 [--progress 100]

It creates the scope and the stream (an existing one is fine), makes one writer and
writes ``count`` JSON events ``{"seq": n, "key": "k<n % keys>", "writer": <name>}`` with
routing key ``k<n % keys>``, prints ``wrote <n>`` every ``--progress`` events (stdout,
flushed) and ``flushed <count>`` once ``flush()`` returned (every event acknowledged by
the segment store), then exits 0. The client retries connection failures by itself.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--controller", required=True)
    parser.add_argument("--scope", default="sc")
    parser.add_argument("--stream", default="st")
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--inflight", type=int, default=100)
    parser.add_argument("--progress", type=int, default=0)
    parser.add_argument("--name", default="w")
    parser.add_argument("--create", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    import pravega_client

    manager = pravega_client.StreamManager(args.controller)
    if args.create:
        manager.create_scope(args.scope)
        manager.create_stream(args.scope, args.stream, args.segments)
    writer = manager.create_writer(args.scope, args.stream, args.inflight)
    for n in range(args.first, args.first + args.count):
        key = f"k{n % args.keys}"
        writer.write_event(json.dumps({"seq": n, "key": key, "writer": args.name}), key)
        done = n - args.first + 1
        if args.progress and done % args.progress == 0:
            print(f"wrote {done}", flush=True)
    writer.flush()
    print(f"flushed {args.count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
