#!/usr/bin/env python3
"""What the ``logjam`` source's receiver thread and its reactor side cost per message, in process.

A PUSH socket queues ``--messages`` logjam request messages (``logjam_load``'s pool,
snappy by default) on the source's PULL socket over loopback TCP while the receiver is
paused; then the real receiver thread (``ZmqReceiver`` with the source's ``decode``)
reads them in its chunks, and the figure is that thread's own CPU time per message
(``pthread_getcpuclockid``: waits are not counted). The chunks it handed over are then
given to the source's reactor side (``LogjamSource.received``, the router a stub that
keeps the batches) on the main thread, timed in its CPU time. Nothing else runs: no GIL
contention, so this is the work per message, not the switching that contention adds.

Run it with the code to measure on ``PYTHONPATH`` (it imports ``logrouter`` from the
checkout it lies in); compare two checkouts by running each in turn, alternating:

    .venv/bin/python bench/logjam_receive.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twisted.internet import task  # noqa: E402

from logjam_decode import Receiver, Router  # noqa: E402 - the same stubs: a router keeping the batches, a receiver doing nothing
from logjam_load import COMPRESSIONS, message_pool  # noqa: E402
from logrouter.sources.base import SourceContext  # noqa: E402
from logrouter.sources.logjam import LogjamSource  # noqa: E402
from logrouter.sources.zmq_receiver import ZmqReceiver  # noqa: E402

WAIT_SECS = 60


class Reactor:
    """``callFromThread`` runs the call at once, in the calling thread."""

    def callFromThread(self, f: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802 - the reactor's name
        f(*args, **kwargs)


def source() -> LogjamSource:
    clock = task.Clock()
    clock.advance(time.time())
    options = {key: option.default for key, option in LogjamSource.OPTIONS.items()}
    options["listen_pull"] = "tcp://127.0.0.1:*"
    jam = LogjamSource("jam", options, SourceContext(router=Router(), reactor=clock, errors=None, state_dir=""))
    jam.receiver = Receiver()  # type: ignore[assignment]
    return jam


def run(pool: list[tuple[bytes, bytes, bytes, bytes]], count: int) -> tuple[float, float]:
    """(receiver thread, reactor side) CPU µs per message for ``count`` messages."""
    jam = source()
    chunks: list[Any] = []
    got = threading.Event()
    received = [0]

    def deliver(chunk: list[Any]) -> None:
        chunks.append(chunk)
        received[0] += len(chunk)
        receiver.done()
        if received[0] >= count:
            got.set()

    receiver = ZmqReceiver(Reactor(), jam.specs, jam.decode, deliver, name="bench", receive_hwm=count + 10)
    receiver.pause()
    started: list[Any] = []
    receiver.start().addBoth(started.append)
    deadline = time.monotonic() + WAIT_SECS
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    endpoint = started[0][0]
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, count + 10)
    push.connect(endpoint)
    for i in range(count):
        stream, topic, blob, meta = pool[i % len(pool)]
        push.send_multipart([stream, topic, blob, meta + (i + 1).to_bytes(8, "big")])
    time.sleep(1.0)  # let the queue reach the receiver's side before it reads (full chunks)
    clock = time.pthread_getcpuclockid(receiver._thread.ident)
    before = time.clock_gettime(clock)
    receiver.resume()
    if not got.wait(WAIT_SECS):
        raise SystemExit(f"only {received[0]} of {count} messages arrived")
    thread_cpu = time.clock_gettime(clock) - before
    receiver.stop()
    push.close(0)
    context.term()
    start = time.process_time()
    for chunk in chunks:
        jam.received(chunk)
    reactor_cpu = time.process_time() - start
    return thread_cpu / count * 1e6, reactor_cpu / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="snappy")
    args = parser.parse_args()
    pool = message_pool(1000, COMPRESSIONS[args.compression], 1)
    threads, reactors = [], []
    for _ in range(args.repeats):
        t, r = run(pool, args.messages)
        threads.append(t)
        reactors.append(r)
    print(f"{args.messages} messages, {args.compression}: CPU µs per message, median of {args.repeats} "
          f"(min-max): receiver thread {statistics.median(threads):.1f} ({min(threads):.1f}-{max(threads):.1f}), "
          f"reactor side {statistics.median(reactors):.1f} ({min(reactors):.1f}-{max(reactors):.1f})")


if __name__ == "__main__":
    main()
