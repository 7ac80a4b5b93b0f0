"""The graceful stop of a stream source: read what connections already delivered, then close.

What a client sent before the stop may still sit in the kernel's buffers, and clients that
do not wait for acks (fluent-logger's default) count it as sent. So a stopping source
stops listening, then goes on reading each connection until it has been quiet at a frame
boundary for ``stop_quiet_secs``, or has given ``stop_drain_bytes``, or the drain's
deadline passes; each connection then closes the usual way (stored batches get their
replies first). This module owns ``STOP_OPTIONS``, the source's side (``DrainingSource``,
mixed into ``StreamSource``) and the connection's (``DrainingConnection``, mixed into
``StreamProtocol``, which calls ``drained`` after each read while ``draining``).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer

from logrouter.config.options import Option, non_negative, positive

STOP_OPTIONS: dict[str, Option] = {
    "stop_drain_secs": Option(
        (int, float),
        3,
        "on a graceful stop, how long connections may go on delivering what they had already sent "
        "before they are closed (0 = close at once; at most a tenth of `[router] shutdown_timeout_secs`)",
        non_negative,
    ),
    "stop_quiet_secs": Option(
        (int, float),
        0.5,
        "on a graceful stop, a connection at a frame boundary that received nothing for this long is done",
        positive,
    ),
    "stop_drain_bytes": Option(
        int, 16 << 20, "on a graceful stop, the most bytes read from one connection before it is closed", positive
    ),
}

# The stop's reading phase gets at most this share of router.shutdown_timeout_secs: the
# rest is for replies, the spool and the sinks' commits.
STOP_SHARE_OF_SHUTDOWN = 0.1

# Holds that do not mean "this connection has work in progress": the stop's drain may
# end while only these are held.
IDLE_HOLDS = frozenset({"backpressure"})


class DrainingConnection:
    """One connection's drain: keep reading until it goes quiet, then ``finish``."""

    source: Any
    closing: bool
    finishing: bool
    holds: set[str]
    finish: Callable[..., None]
    unprocessed_bytes: Callable[[], int]
    draining: bool
    drain_bytes: int
    last_data: float
    drain_call: Any

    def start_drain(self) -> None:
        """Keep reading what the client had sent before the stop, until it goes quiet."""
        if self.closing or self.finishing or self.draining:
            return
        self.draining = True
        self.drain_bytes = 0
        self.last_data = self.source.reactor.seconds()
        self.drain_call = self.source.reactor.callLater(self.source.options["stop_quiet_secs"], self.check_quiet)

    def drained(self, received: int) -> None:
        self.drain_bytes += received
        self.last_data = self.source.reactor.seconds()
        if self.drain_bytes >= self.source.options["stop_drain_bytes"]:
            self.end_drain(f"stop_drain_bytes ({self.source.options['stop_drain_bytes']}) read")

    def check_quiet(self) -> None:
        self.drain_call = None
        if not self.draining:
            return
        quiet = self.source.options["stop_quiet_secs"]
        wait = self.last_data + quiet - self.source.reactor.seconds()
        if wait <= 0 and (self.unprocessed_bytes() or self.holds - IDLE_HOLDS):
            # Mid-frame, or a frame is being worked on: give it the rest of the deadline.
            wait = quiet
        if wait > 0:
            self.drain_call = self.source.reactor.callLater(wait, self.check_quiet)
            return
        self.end_drain("")

    def end_drain(self, why: str) -> None:
        if not self.draining:
            return
        unprocessed = self.unprocessed_bytes()
        details = [why] if why else []
        if unprocessed:
            details.append(f"{unprocessed} bytes of an incomplete frame dropped")
        self.finish(
            "stopping",
            "warn" if details else "info",
            "{protocol} {peer}: source stopping: read {count} more bytes{details}; closing connection",
            count=self.drain_bytes,
            details="".join(f", {d}" for d in details),
        )


class DrainingSource:
    """The source's side: stop listening, drain every connection, bound the drain in time."""

    options: dict[str, Any]
    router: Any
    reactor: Any
    port: Any
    connections: set[Any]

    def stop(self) -> defer.Deferred:
        """Stop accepting; read what connections already delivered; let stored batches get
        their replies; then close.

        What a client sent before the stop may still sit in the kernel's buffers, and
        clients that do not wait for acks (fluent-logger's default) count it as sent.
        Each connection goes on being read until it has been quiet at a frame boundary
        for ``stop_quiet_secs`` (nothing in the kernel or on the wire; TCP cannot say
        more precisely what the client still holds, and a half-close would not either),
        or has given ``stop_drain_bytes``, or the drain's deadline passes.
        """
        d = defer.maybeDeferred(self.port.stopListening) if self.port is not None else defer.succeed(None)
        return d.addCallback(lambda _: self.drain())

    def stop_drain_secs(self) -> float:
        limit = float(self.options["stop_drain_secs"])
        config = getattr(self.router, "config", None)
        shutdown = getattr(config, "router", {}).get("shutdown_timeout_secs", 0) if config is not None else 0
        if shutdown:
            limit = min(limit, shutdown * STOP_SHARE_OF_SHUTDOWN)
        return limit

    def drain(self) -> defer.Deferred:
        limit = self.stop_drain_secs()
        connections = list(self.connections)
        for connection in connections:
            connection.start_drain()
            if limit <= 0:
                connection.end_drain("")
        deadline = self.reactor.callLater(limit, self.drain_timed_out) if limit > 0 else None
        waiting = defer.DeferredList([c.when_closed() for c in connections], consumeErrors=True)

        def drained(_: Any) -> None:
            if deadline is not None and deadline.active():
                deadline.cancel()

        return waiting.addCallback(drained)

    def drain_timed_out(self) -> None:
        for connection in list(self.connections):
            connection.end_drain(f"stop_drain_secs ({self.stop_drain_secs():g}s) passed")
