"""What the spool writes for a Beats window, stored as its documents (``json-documents``)
or as the ``C`` frame it arrived in (``lumberjack-zlib``): bytes per event, and the CPU of
a spool append (the record's encoding, its frame's two CRCs, the ``write`` into the page
cache; no fsync), in one process, alternating, ratios only.

Each window is ``--events`` Filebeat 8 events (``native_decode.filebeat``, ~1 KB of JSON
each) in one ``C`` frame at Beats' default level 3, read by the lumberjack source on a
``StringTransport`` as on arrival (native read where the extension is installed); the
same batch is then stored both ways, so only the stored format differs.

    .venv/bin/python bench/spool_compressed.py --windows 20 --events 2048 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from native_decode import filebeat  # noqa: E402
import source_fakes  # noqa: E402
from logrouter.batch import Batch  # noqa: E402
from logrouter.sources.compressed_documents import LUMBERJACK_ZLIB  # noqa: E402
from logrouter.sources.lumberjack import LumberjackSource  # noqa: E402
from logrouter.spool.record import encode_batch  # noqa: E402
from logrouter.spool.segment import frame_head  # noqa: E402
from logrouter.wire import lumberjack as lj  # noqa: E402
from logrouter.wire.lumberjack_frames import json_frame_documents  # noqa: E402


def batches(count: int, events: int) -> list[tuple[Batch, Batch]]:
    """Per window: the batch stored compressed, and the same stored as its documents."""
    source, router, _ = source_fakes.make_source(LumberjackSource, "beats", tag="beats.${@metadata.beat}")
    conn = source_fakes.Conn(source)
    out = []
    for w in range(count):
        conn.send(lj.encode_window_frames([filebeat(w * events + i) for i in range(events)]))
        live = router.calls[-1].batch
        assert live.packed[0] == LUMBERJACK_ZLIB, live.packed[0]
        payloads, now, drop_metadata, _ = live.packed[1:]
        documents = [d for p in payloads for d in json_frame_documents(zlib.decompress(p))]
        plain = Batch(live.tag, live.events, "beats", packed=("json-documents", documents, now, drop_metadata), json_values=True)
        out.append((Batch(live.tag, live.events, "beats", packed=live.packed, json_values=True), plain))
        router.fire_pending()
    return out


def append_all(chosen: list[Batch], fd: int) -> tuple[float, int]:
    """CPU seconds of appending ``chosen`` as the spool's writer does (no fsync), and the bytes."""
    written = 0
    start = time.process_time()
    for batch in chosen:
        payload = encode_batch(batch)
        written += os.write(fd, frame_head(payload) + payload)
    return time.process_time() - start, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--events", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    made = batches(args.windows, args.events)
    events = args.windows * args.events
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(os.path.join(tmp, "segment"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            ratios = []
            for r in range(args.repeats):
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                plain_cpu, plain_bytes = append_all([p for _, p in made], fd)
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                zlib_cpu, zlib_bytes = append_all([c for c, _ in made], fd)
                ratios.append(plain_cpu / zlib_cpu)
                print(f"run {r + 1}: json-documents {plain_bytes / events:7.1f} B/event {plain_cpu / events * 1e9:7.0f} ns/event | "
                      f"lumberjack-zlib {zlib_bytes / events:6.1f} B/event {zlib_cpu / events * 1e9:6.0f} ns/event | "
                      f"bytes {plain_bytes / zlib_bytes:5.1f}x fewer, append CPU {plain_cpu / zlib_cpu:5.1f}x less")
            ratios.sort()
            print(f"median append CPU ratio (json-documents / lumberjack-zlib): {ratios[len(ratios) // 2]:.1f}x")
        finally:
            os.close(fd)


if __name__ == "__main__":
    main()
