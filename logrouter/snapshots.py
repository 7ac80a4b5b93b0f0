"""What the router saves beside the spool so it can be trimmed: the id window and the
filters' memory, and when a spool segment may go.

Two snapshots cover the spool up to a position: the id window (``dedupe.msgpack``: the
batch ids and writers' event numbers stored, ``logrouter.dedupe``) and the memory of the
filters that keep one (``filters.msgpack``, ``logrouter.filters.memory``). A segment is
deleted only once every sink's cursor and both snapshots are past it, so that a start can
always rebuild both: the window from its snapshot and the ids of the records after it
(``replay_ids``, at start, in a thread with its progress logged), the filters' memory
from its file and a warm-up over the records after what it covers.

``trim`` runs on the reactor whenever a sink moves; a snapshot is saved before a trim
that needs it, and at least every ``DEDUPE_SNAPSHOT_SECS`` while something changed; the
stop saves both once more. Saves run through the injected thread runner
(``run_blocking``), the clock is injected too: tests run them synchronously on a
``task.Clock``.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger

from logrouter import dedupe
from logrouter.progress import ProgressLog
from logrouter.spool.record import decode_key

READ_CHUNK_BYTES = 4 << 20  # of spool records read at a time
DEDUPE_SNAPSHOT_SECS = 10.0


class Snapshots:
    """The id window's and the filters' memory's files, and the spool trim they allow."""

    log = Logger(namespace="logrouter.router")

    def __init__(
        self, path: str, window: dedupe.DedupeWindow, memory: Any, spool: Any, clock: Any, run_blocking: Callable[..., defer.Deferred]
    ) -> None:
        """``path``: the id window's file; ``memory``: the ``FilterMemory``; ``spool``: the
        ``SpoolLog`` (read at start, trimmed)."""
        self.path = path
        self.window = window
        self.memory = memory
        self.spool = spool
        self.clock = clock
        self.run_blocking = run_blocking
        self.position = 0  # the saved snapshots cover the spool before this position
        self.loaded = False  # the id window was read back whole (a stop can cut that short)
        self.saved_at = float("-inf")
        self.saving: defer.Deferred | None = None  # a save under way
        self.replay_progress = (0, 0)  # (bytes done, of) of the ids' replay at start, set by its thread
        self.on_saved: Callable[[], None] = lambda: None  # a save is on disk: the router trims again

    # -- reading back at start -------------------------------------------------------------

    def replay_ids(self, stopping: Callable[[], bool] = lambda: False) -> defer.Deferred:
        """``load_ids`` in a thread, its progress logged (``logrouter.progress``)."""
        replay = ProgressLog(self.clock, "spool replay at start (ids of stored batches)", lambda: self.replay_progress)

        def done(result: Any) -> Any:
            replay.finish("done" if self.loaded else "stopped")
            return result

        return self.run_blocking(self.load_ids, stopping).addBoth(done)

    def load_ids(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """The id window as it was: the snapshot, then the ids of the records after it
        (blocking; ``stopping()`` cuts it short)."""
        saved = dedupe.load_snapshot(self.path)
        self.window.restore(saved)
        self.position = saved.position
        position = begin = max(saved.position, self.spool.start)
        end = self.spool.end
        self.replay_progress = (0, end - begin)
        while position < end and not stopping():
            records, next_position = self.spool.read(position, end, READ_CHUNK_BYTES)
            for record in records:
                try:
                    key = decode_key(record.payload)
                    if key is not None:
                        self.window.add(key, record.offset)
                except Exception:
                    continue  # a damaged key only weakens deduplication
            if next_position <= position:
                break  # cannot happen with a sane spool; never loop on it
            position = next_position
            self.replay_progress = (position - begin, end - begin)
        self.loaded = position >= end

    @defer.inlineCallbacks
    def load_memory(self, filters: dict[str, Any]) -> Any:
        """The filters' saved memory, given back to them; the spool after what it covers is
        kept for the warm-up."""
        yield self.run_blocking(self.memory.load)
        self.memory.restore(filters)
        self.position = min([self.position, *self.memory.starts.values()])

    # -- saving, trimming -------------------------------------------------------------------

    def trim(self, filters: dict[str, Any], cursor: int, routed_end: int) -> None:
        """Delete spool segments every sink is done with (``cursor``, the smallest) and the
        snapshots cover; save the snapshots first if they lag, or every few seconds."""
        if not self.memory.ready:
            return  # the filters' memory is being read back (the start's warm-up) from the spool
        self.memory.release(filters, cursor)
        first_end = self.spool.first_segment_end
        if first_end is not None and first_end <= cursor:
            if self.position < cursor:
                self.save(filters, routed_end)
                return  # trimmed once the snapshot is on disk
            self.spool.delete_before(min(cursor, self.position))
        elif self.clock.seconds() - self.saved_at > DEDUPE_SNAPSHOT_SECS and (
            self.window.batch_ids or self.window.writers or self.window.events or self.memory.changed(filters)
        ):
            self.save(filters, routed_end)

    def save(self, filters: dict[str, Any], routed_end: int) -> defer.Deferred:
        """Save both snapshots (one save at a time), covering up to ``routed_end`` and what
        the filters' memory covers."""
        if self.saving is not None:
            return self.saving
        position = routed_end
        # The spool from where the filters' memory saved (or restored) ends is kept for a
        # warm-up at the next start (logrouter.filters.memory).
        covered = self.memory.covered(filters)
        if covered is not None:
            position = min(position, covered)
        batch_digests, writers, events = self.window.snapshot()
        memory = self.memory.capture(filters)
        self.saved_at = self.clock.seconds()

        def save() -> None:
            dedupe.save_snapshot(self.path, batch_digests, position, writers, events)
            self.memory.save(memory)

        def saved(_: Any) -> None:
            self.saving = None
            self.position = max(self.position, position)
            self.on_saved()

        def failed(failure: Any) -> None:
            self.saving = None
            self.log.failure("saving the dedupe snapshot failed", failure)

        d = self.saving = self.run_blocking(save)
        d.addCallbacks(saved, failed)
        return d

    def idle(self) -> defer.Deferred:
        """Fires once no save is under way."""
        if self.saving is None:
            return defer.succeed(None)
        return defer.DeferredList([self.saving], consumeErrors=True)

    @defer.inlineCallbacks
    def save_at_stop(self, filters: dict[str, Any], routed_end: int, cursor: int) -> Any:
        """The last save, once the sinks committed (``cursor``: the smallest of theirs). A
        disk that refuses it fails nothing: the next start reads back from the spool."""
        # The end of a save may start another (its ``on_saved`` trims, a trim may save):
        # wait until none is under way, and hold ``saving`` meanwhile so no trim starts
        # one (the window's copy buffer is shared by its saves, one at a time).
        while self.saving is not None:
            yield self.idle()
        if self.loaded:
            try:
                batch_digests, writers, events = self.window.snapshot()
                self.saving = self.run_blocking(dedupe.save_snapshot, self.path, batch_digests, routed_end, writers, events)
                try:
                    yield self.saving
                finally:
                    self.saving = None
            except OSError as e:
                # A full disk must not fail the stop: the next start reads the window back
                # from the older snapshot and the spool after it (trimmed only past a snapshot).
                self.log.error("saving the dedupe snapshot at the stop failed ({error}); the next start "
                               "rebuilds the window from the spool", error=e)
        self.memory.release(filters, cursor)  # the sinks' final commits
        memory = self.memory.capture(filters)
        if memory is not None:
            try:
                yield self.run_blocking(self.memory.save, memory)
            except OSError as e:
                # As above: the next start warms the filters up from the older memory (the
                # spool is trimmed only past what a saved memory covers).
                self.log.error("saving the filters' memory at the stop failed ({error}); the next start "
                               "reads it back from the spool", error=e)
