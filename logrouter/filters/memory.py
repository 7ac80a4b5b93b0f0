"""What filters with a memory (``dedupe``) remember across restarts, and how it comes back.

A sink's exactly-once rests on replays being deterministic: after a crash it replays the
spool from its cursor, and what a filter passes then must be what it passed the first
time. ``dedupe`` decides an event by the windows opened before it, possibly in records
before that cursor, which no sink replays. So its memory is saved (``filters.msgpack`` in
the spool directory, with the router's id window snapshot: every few seconds, before spool
segments are deleted, and at a stop) together with the spool position before which every
record routed through the filter had been decided when it was taken.

At start, a filter whose saved memory matches its type and options takes it back; then,
before any sink is fed, the records from that position up to the furthest cursor of the
sinks the filter feeds are routed through the filters again without reaching any sink
(``Routing.dry``): the *warm-up*. Without a saved memory (a new filter, changed options,
the first start of this version) the warm-up starts at the spool's first record. Either
way the filter has decided every record before any cursor, in spool order, as the first
time; the sinks' replays from their cursors then get the same decisions again. The spool
is trimmed only before the position a saved memory covers, so the warm-up can read it.

A filter with a memory provides ``fingerprint()`` (what its decisions depend on),
``covered()`` (the spool position before which it decided every record routed to it),
``snapshot() -> (covered, state)`` (on the reactor; the state immutable), ``encode(state)``
(any thread; msgpack-able), ``restore(encoded, covered)``, ``release(position)`` (no record
before it is routed again: every sink's cursor is past it) and ``changes`` (a counter that
moves when its memory does).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import msgpack
from twisted.internet import defer
from twisted.logger import Logger

from logrouter.atomic_file import replace_file
from logrouter.batch import Routing
from logrouter.serial import defer_to_thread
from logrouter.spool.record import decode_batch

VERSION = 1
READ_BYTES = 4 << 20  # of spool records read and decoded at a time

log = Logger(namespace="logrouter.filters")


def remembering(filters: dict[str, Any]) -> dict[str, Any]:
    """The filters among ``filters`` that keep a memory."""
    return {name: f for name, f in filters.items() if hasattr(f, "restore") and hasattr(f, "snapshot")}


class FilterMemory:
    """The saved memory of a router's filters (one file), loaded, restored, warmed up, saved."""

    def __init__(self, spool_path: str) -> None:
        self.path = os.path.join(spool_path, "filters.msgpack")
        self.loaded: dict[str, list] = {}
        # Per filter with a memory, the spool position its restored memory covers (0: none).
        self.starts: dict[str, int] = {}
        # Not between ``load`` and the end of the warm-up: the memory may be saved, and the
        # spool trimmed by what it covers.
        self.ready = True
        self._saved_changes: dict[str, int] = {}

    # -- start ----------------------------------------------------------------------------

    def load(self) -> None:
        """Read the saved memory (blocking: run it in a thread). A damaged file only costs
        a longer warm-up."""
        self.ready = False
        try:
            with open(self.path, "rb") as f:
                saved = msgpack.unpackb(f.read(), raw=False, use_list=False, strict_map_key=False)
            version, filters = saved
            if version != VERSION or not isinstance(filters, dict):
                raise ValueError(f"version {version!r}")
            self.loaded = dict(filters)
        except FileNotFoundError:
            self.loaded = {}
        except Exception as e:  # noqa: BLE001 - damage of any kind: start from the spool instead
            log.warn("the filters' saved memory {path} cannot be read ({error}); they read it back "
                     "from the spool", path=self.path, error=f"{type(e).__name__}: {e}")
            self.loaded = {}

    def restore(self, filters: dict[str, Any]) -> None:
        """Hand each filter with a memory what was saved for it, if it matches."""
        for name, component in remembering(filters).items():
            entry = self.loaded.get(name)
            self.starts[name] = 0
            if entry is None:
                continue
            try:
                kind, fingerprint, covered, state = entry
                if kind != component.TYPE or msgpack.packb(fingerprint) != msgpack.packb(component.fingerprint()):
                    continue  # another filter, or other options: what it remembers does not apply
                component.restore(state, covered)
                self.starts[name] = covered
            except Exception as e:  # noqa: BLE001 - a damaged entry: warmed up from the spool's start
                log.warn("filter {name}: its saved memory cannot be restored ({error}); it is read back from "
                         "the spool", name=name, error=f"{type(e).__name__}: {e}")
        self.loaded = {}

    def warm_up_range(
        self, reach: dict[str, frozenset[str]], delivered: dict[str, int], spool_start: int
    ) -> tuple[int, int, frozenset[str]] | None:
        """The spool range to route dry, and the sinks to route it for (so that the
        filters with a memory run), or None. ``reach``: per filter, the sinks it feeds;
        ``delivered``: per started sink, where its replay starts."""
        start, end, targets = None, 0, frozenset()
        for name, covered in self.starts.items():
            sinks = reach.get(name, frozenset())
            furthest = max((delivered[s] for s in sinks if s in delivered), default=0)
            first = max(covered, spool_start)
            if first < furthest:
                start = first if start is None else min(start, first)
                end = max(end, furthest)
                targets |= sinks
        return None if start is None else (start, end, targets)

    @defer.inlineCallbacks
    def warm_up(
        self,
        span: tuple[int, int, frozenset[str]] | None,
        read: Callable[[int, int, int], tuple[list, int]],
        route: Callable[[Any, Routing], None],
        run_blocking: Callable[..., defer.Deferred] = defer_to_thread,
    ) -> Any:
        """Route the records of ``span`` dry: ``read`` is ``SpoolLog.read``, ``route(batch,
        routing)`` pushes a batch down its routes; the reads run through ``run_blocking``
        (a thread, in the daemon)."""
        if span is not None:
            position, end, targets = span
            log.info("filters with a memory: reading spool positions {start} to {end} back into it",
                     start=position, end=end)
            while position < end:
                records, next_position = yield run_blocking(_read_batches, read, position, end)
                for record, batch in records:
                    if batch is not None:  # undecodable: the sinks' replay reports it
                        route(batch, Routing(record.offset, record.end, len(record.payload), targets, dry=True))
                if next_position <= position:
                    break  # cannot happen with a sane spool; never loop on it
                position = next_position
        self.ready = True

    # -- saving ---------------------------------------------------------------------------

    def covered(self, filters: dict[str, Any]) -> int | None:
        """The spool position the memory to save covers (None: no filter has a memory);
        before the warm-up, the one restored."""
        if not self.ready:
            return min(self.starts.values(), default=None)
        positions = [f.covered() for f in remembering(filters).values()]
        return min(positions, default=None)

    def changed(self, filters: dict[str, Any]) -> bool:
        return any(self._saved_changes.get(name) != f.changes for name, f in remembering(filters).items())

    def capture(self, filters: dict[str, Any]) -> list[Any] | None:
        """What ``save`` writes, taken now (on the reactor); None before the warm-up, when
        there is nothing whole to save yet."""
        if not self.ready:
            return None
        captured = []
        for name, component in remembering(filters).items():
            covered, state = component.snapshot()
            captured.append((name, component.TYPE, component.fingerprint(), covered, component.encode, state))
            self._saved_changes[name] = component.changes
        return captured

    def save(self, captured: list[Any] | None) -> None:
        """Write ``capture``'s memory atomically (blocking: run it in a thread)."""
        if captured is None:
            return
        if not captured:
            try:
                os.remove(self.path)  # no filter keeps a memory now: nothing stale for a later one
            except FileNotFoundError:
                pass
            return
        filters = {
            name: [kind, fingerprint, covered, encode(state)]
            for name, kind, fingerprint, covered, encode, state in captured
        }
        try:
            data = msgpack.packb([VERSION, filters], use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            for entry in filters.values():
                entry[3] = _packable(entry[3])
            data = msgpack.packb([VERSION, filters], use_bin_type=True)
        replace_file(self.path, data)

    def release(self, filters: dict[str, Any], position: int) -> None:
        for component in remembering(filters).values():
            component.release(position)


def _packable(rows: Iterable[Any]) -> list[Any]:
    """``rows`` less those msgpack cannot hold (a key with an integer past 64 bits): such a
    key is only forgotten at a restart."""
    kept = []
    for row in rows:
        try:
            msgpack.packb(row, use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            continue
        kept.append(row)
    return kept


def _read_batches(read: Callable[[int, int, int], tuple[list, int]], start: int, end: int) -> tuple[list, int]:
    """Spool records from ``start`` with their batches (None: undecodable), in a thread."""
    records, next_position = read(start, end, READ_BYTES)
    decoded = []
    for record in records:
        try:
            decoded.append((record, decode_batch(record.payload)[0]))
        except Exception:  # noqa: BLE001 - the sinks' replay reports it
            decoded.append((record, None))
    return decoded, next_position
