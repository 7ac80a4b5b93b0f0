"""The decode step alone: PackedForward entries -> one lake row group, native vs Python.

What each path does with the inflated entries of ``--blobs`` PackedForward messages
of ``--events`` events each (one row group):

- ``python``: what runs without the extension: each blob decoded into events
  (``decode_entries``, msgspec), then the file's schema chosen from them
  (``schema.file_schema``) and the Arrow table built (``convert.TableBuilder``);
- ``native``: each blob scanned (``lazy_events``: the extension checks and counts
  it, nothing is built), then schema and table straight from the bytes
  (``native_table.file_schema_of`` and ``build_table``).

With ``--stage offload`` it times what the source's worker threads do with one
CompressedPackedForward message of all the blobs (past ``offload_bytes``): its parts
(``forward_offload.blob_parts``: inflated and checked, then each part decoded in Python,
or framed, checked and kept packed by the extension).

With ``--stage arrival`` it times instead what the reactor does with those messages as
they arrive, up to the batch the source hands on: ``ForwardDecoder.feed`` of each framed
PackedForward message (framing, then the events: decoded in Python, or checked and
kept packed by the extension, ``forward_lazy.kept_or_decoded``). The same messages
decode to the same events both ways (tests/integration/test_native_lake.py, the fuzz tests).

With ``--stage framing`` it times the framing of those messages alone, as out_forward
writes them (``[tag, str32 blob, {"chunk": ..., "size": ...}]``) and as the source
receives them, in 64 KiB reads: ``MsgpackFramer.frames`` with the Python framer
(``python``: an unpacker, and a scanner turning each blob's str header into bin) and
with native framing (``native``: ``logrouter_native.forward_frames``, each blob sliced
out of the reads once). ``--stage reads`` times ``ForwardDecoder.feed`` of the same
reads, events kept packed by the extension either way, the framing Python or native:
the arrival side of the reactor as the daemon runs it.

Both give the same table (tests/unit/test_native_table.py). The two paths run in the same
process, alternating, ``--repeats`` times each; each run is timed in CPU seconds of
the process (``time.process_time``) and printed per million events, and the ratio of
each pair of neighbouring runs is given as median, min and max: on a loaded machine
the ratio is the figure to read, not the rates. ``--shape flat`` is
``bench/forward_load.py``'s ~100-byte 4-field records; ``--shape filebeat`` the
~1 KB nested records of a Filebeat 8 event (``bench/lumber_send``) as a fluent
sender would forward them.

    .venv/bin/python bench/native_decode.py --shape flat --repeats 7
    .venv/bin/python bench/native_decode.py --shape filebeat --repeats 7
    .venv/bin/python bench/native_decode.py --stage arrival --shape flat
    .venv/bin/python bench/native_decode.py --stage offload --shape flat --blobs 40
    .venv/bin/python bench/native_decode.py --stage framing --shape flat
    .venv/bin/python bench/native_decode.py --stage reads --shape flat
"""

from __future__ import annotations

import argparse
import gc
import gzip
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402

from logrouter.lake.convert import TableBuilder  # noqa: E402
from logrouter.lake.native_table import PendingRows, build_table, file_schema_of  # noqa: E402
from logrouter.lake.schema import ColumnTypes, file_schema  # noqa: E402
from logrouter.native import NATIVE, describe  # noqa: E402
from logrouter.wire import forward_lazy  # noqa: E402
from logrouter.wire import fluent_forward  # noqa: E402
from logrouter.wire.fluent_forward import ForwardDecoder, decode_entries  # noqa: E402
from logrouter.wire.forward_framing import NATIVE_FRAMES, MsgpackFramer  # noqa: E402
from logrouter.wire.forward_lazy import PackedEvents, lazy_events  # noqa: E402
from logrouter.wire.forward_messages import DEFAULT_PART_BYTES  # noqa: E402
from logrouter.wire.forward_offload import blob_parts  # noqa: E402

T0 = 1_764_000_000


def flat(i: int) -> dict:
    return {"host": "web-%02d" % (i % 17), "level": "info" if i % 5 else "warn",
            "msg": "GET /api/v1/items/%06d 200" % i, "bytes": 512 + i}


def filebeat(i: int) -> dict:
    return {
        "@timestamp": "2026-11-26T10:%02d:%02d.%03dZ" % (i // 3600 % 60, i // 60 % 60, i % 1000),
        "@metadata": {"beat": "filebeat", "type": "_doc", "version": "8.11.0"},
        "message": '10.0.%d.%d - - [26/Nov/2026:10:00:00 +0000] "GET /api/v1/items/%06d HTTP/1.1" 200 %d "-" '
                   '"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36"' % (i % 256, i % 200, i, 512 + i % 1000),
        "log": {"offset": 1000 * i, "file": {"device_id": "64769", "inode": "1839212", "path": "/var/log/nginx/access.log"}},
        "input": {"type": "filestream"},
        "ecs": {"version": "8.0.0"},
        "host": {"hostname": "web-%02d" % (i % 17), "architecture": "x86_64",
                 "os": {"kernel": "6.1.0-13-amd64", "codename": "bookworm", "type": "linux", "platform": "debian",
                        "version": "12 (bookworm)", "family": "debian", "name": "Debian GNU/Linux"},
                 "id": "8e6bd3d7a1b64e3c9a1d1c1f5e2f0a11", "containerized": False,
                 "ip": ["10.0.0.%d" % (i % 17), "fe80::5054:ff:fe12:3456"], "mac": ["52-54-00-12-34-56"],
                 "name": "web-%02d" % (i % 17)},
        "agent": {"ephemeral_id": "3f0a6c1e-2b8d-4f57-9c3e-2a1b0c9d8e7f", "id": "b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e",
                  "name": "web-%02d" % (i % 17), "type": "filebeat", "version": "8.11.0"},
    }


def blobs(shape: str, count: int, events: int) -> list[bytes]:
    make = flat if shape == "flat" else filebeat
    packer = msgpack.Packer()
    out = []
    for b in range(count):
        out.append(b"".join(
            packer.pack([msgpack.ExtType(0, struct.pack(">II", T0, (b * events + i) * 1000)), make(b * events + i)])
            for i in range(events)
        ))
    return out


def lake_python(entries: list[bytes]) -> int:
    events = []
    for blob in entries:
        events += decode_entries(blob, None)[0]
    types = ColumnTypes()
    inferred: dict = {}
    schema = file_schema(types, [record for _, record in events], inferred)
    return TableBuilder(schema, types).build(events, inferred).num_rows


def lake_native(entries: list[bytes], checked: bool = True) -> int:
    pending = PendingRows()
    for blob in entries:
        events = lazy_events(blob, None)
        if not checked:  # as before PackedEvents.checked: the build checks the bytes again
            events = PackedEvents(events.entries, events.now, events.buckets)
        pending.extend(events)
    types = ColumnTypes()
    schema = file_schema_of(types, pending, {})
    return build_table(TableBuilder(schema, types), pending).num_rows


def arrival(messages: list[bytes], native: bool) -> int:
    """What the reactor does with the framed messages, as the source's decoder does it
    (a message under ``offload_bytes``): the events of each, packed or decoded."""
    forward_lazy.NATIVE = NATIVE if native else None  # what LOGROUTER_NATIVE=0 does at import
    decoder = ForwardDecoder()
    count = 0
    for data in messages:
        for message in decoder.feed(data):
            assert (type(message.events) is PackedEvents) is native
            count += len(message.events)
    return count


def offload(messages: list[bytes], native: bool) -> int:
    """What the source's worker threads do with a message past ``offload_bytes``: its
    parts (``forward_offload.blob_parts``: inflate and check, then each part decoded
    in Python, or framed, checked and kept packed by the extension)."""
    count = 0
    for blob in messages:
        for part in blob_parts("app", blob, "gzip", b"c", {}, len(blob), 1 << 30, time.time_ns,
                               DEFAULT_PART_BYTES, native=NATIVE if native else None):
            if part is not None:
                assert (type(part.events) is PackedEvents) is native or not part.events
                count += len(part.events)
    return count


READ_BYTES = 64 * 1024


def reads_of(messages: list[bytes]) -> list[bytes]:
    stream = b"".join(messages)
    return [stream[at : at + READ_BYTES] for at in range(0, len(stream), READ_BYTES)]


def framing(reads: list[bytes], native: bool, events: int) -> int:
    """The framer alone: each read's messages."""
    framer = MsgpackFramer(64 << 20, NATIVE_FRAMES if native else None)
    count = 0
    for data in reads:
        for message, _ in framer.frames(data):
            assert type(message[1]) is bytes
            count += events
    return count


def decoded_reads(reads: list[bytes], native: bool) -> int:
    """``ForwardDecoder.feed`` of each read, events kept packed, the framing Python or native."""
    forward_lazy.NATIVE = NATIVE
    frames = NATIVE_FRAMES if native else None
    fluent_forward.MsgpackFramer = lambda limit: MsgpackFramer(limit, frames)  # type: ignore[misc]
    try:
        decoder = ForwardDecoder()
        count = 0
        for data in reads:
            for message in decoder.feed(data):
                assert type(message.events) is PackedEvents
                count += len(message.events)
    finally:
        fluent_forward.MsgpackFramer = MsgpackFramer  # type: ignore[misc]
    return count


def timed(path, entries: list[bytes], rounds: int) -> float:
    """CPU seconds per million events of ``rounds`` runs of ``path``, freeing included."""
    gc.collect()
    start = time.process_time()
    rows = 0
    for _ in range(rounds):
        rows += path(entries)
    return (time.process_time() - start) / rows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=("lake", "arrival", "offload", "framing", "reads"), default="lake",
                        help="lake: entries into a row group; arrival: framed messages into events; "
                        "offload: one gzip message of all the blobs into parts; framing: 64 KiB reads into "
                        "messages, Python vs native framing; reads: the reads into packed events, the same")
    parser.add_argument("--shape", choices=("flat", "filebeat"), default="flat")
    parser.add_argument("--blobs", type=int, default=10, help="PackedForward messages per row group")
    parser.add_argument("--events", type=int, default=1000, help="events per message")
    parser.add_argument("--rounds", type=int, default=5, help="row groups per timed run")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each path, alternating")
    parser.add_argument("--versus", choices=("python", "unchecked"), default="python",
                        help="the path the native one is compared with (reported as 'python'); unchecked "
                        "(--stage lake): the native build checking the scanned bytes again, as before")
    args = parser.parse_args()
    if NATIVE is None:
        sys.exit(f"the native extension is not here: {describe()}")
    entries = blobs(args.shape, args.blobs, args.events)
    size = sum(map(len, entries)) / (args.blobs * args.events)
    if args.stage == "arrival":
        entries = [msgpack.packb(["app", blob, {"chunk": "c%d" % i}], use_bin_type=True) for i, blob in enumerate(entries)]
        python_path = lambda messages: arrival(messages, False)  # noqa: E731
        native_path = lambda messages: arrival(messages, True)  # noqa: E731
    elif args.stage in ("framing", "reads"):
        # out_forward's shape: the blob a str32, options chunk and size
        reads = reads_of([
            b"\x93\xa3app\xdb" + struct.pack(">I", len(blob)) + blob
            + msgpack.packb({"chunk": "c%d" % i, "size": args.events}) for i, blob in enumerate(entries)
        ])
        entries = reads
        if args.stage == "framing":
            python_path = lambda reads: framing(reads, False, args.events)  # noqa: E731
            native_path = lambda reads: framing(reads, True, args.events)  # noqa: E731
        else:
            python_path = lambda reads: decoded_reads(reads, False)  # noqa: E731
            native_path = lambda reads: decoded_reads(reads, True)  # noqa: E731
    elif args.stage == "offload":
        entries = [gzip.compress(b"".join(entries), 1)]
        python_path = lambda messages: offload(messages, False)  # noqa: E731
        native_path = lambda messages: offload(messages, True)  # noqa: E731
    else:
        python_path, native_path = lake_python, lake_native
        if args.versus == "unchecked":
            python_path = lambda entries: lake_native(entries, False)  # noqa: E731
    assert python_path(entries) == native_path(entries) == args.blobs * args.events
    print(f"{args.stage}, {args.shape}: {args.blobs} x {args.events} events per round, {size:.0f} bytes of msgpack "
          f"per event; {args.rounds} rounds per run, {args.repeats} runs of each path, alternating")
    results: dict[str, list[float]] = {"python": [], "native": []}
    ratios = []
    for repeat in range(args.repeats):
        order = ("python", "native") if repeat % 2 == 0 else ("native", "python")
        for name in order:
            results[name].append(timed(python_path if name == "python" else native_path, entries, args.rounds))
        ratios.append(results["python"][-1] / results["native"][-1])
    for name, runs in results.items():
        print(f"  {name:6}: CPU s per million events: median {statistics.median(runs):.3f} "
              f"(min {min(runs):.3f}, max {max(runs):.3f})")
    print(f"  python / native, pair by pair: median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
