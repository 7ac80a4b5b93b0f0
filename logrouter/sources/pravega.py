"""The ``pravega`` source: Pravega writers into the lake, as a segment store and controller.

An application writing with the official Pravega client asks the controller (gRPC,
``logrouter.pravega.controller``, served from this source's ``controller_listen``) for a
stream's segments and where they live, then appends to each segment over the segment
store wire protocol (``logrouter.wire.pravega``) on ``listen``. This module is the
segment store's append path (``docs/protocols/pravega.md`` §3, §6):

- **Hello:** the client's versions must overlap ours (5..17; the Rust client says 15, the
  Java one 17); we answer ``Hello(17, 5)``, or answer and close when they do not.
- **SetupAppend** names a segment (``scope/stream/N.#epoch.E``) that must belong to a
  stream created through the controller (else ``NoSuchSegment``), and the delegation
  token when ``delegation_token`` is set (else ``AuthTokenCheckFailed`` and close). It is
  answered ``AppendSetup`` with the writer's last event number **stored** for that
  segment (``Long.MIN_VALUE`` for a new writer), from the router's writer table, which
  the spool and the dedupe snapshot keep across restarts. If appends of that writer are
  still being stored (from a connection that was cut), the answer waits for them: an
  answer that counted them before they are durable could lose them, one that did not
  could store them twice.
- **Appends** (``AppendBlock`` + ``AppendBlockEnd``, or a standalone ``AppendBlockEnd`` as
  the Rust client sends) carry whole events and ``lastEventNumber``: each block is one
  batch stored under the writer key ``(segment, writer id)`` and that number, so a block
  whose numbers are already stored is acknowledged without being stored again. Acks are
  ``DataAppended`` (cumulative by event number, with the previous ack level), written
  **only once the block is durable**, in the order the blocks arrived.
- **Events:** each payload is the application's serialized bytes: ``payload = "json"``
  (an object is the record, any other JSON value is ``{"value": v}``), ``"string"``
  (``{"message": text}``, UTF-8) or ``"bytes"`` (``{"data": payload}``). A payload that
  does not parse goes to the error path with the reason; its block is stored (the rest
  of it) and acknowledged all the same, or the writer would resend it forever. The tag
  renders ``tag`` over ``scope`` and ``stream``; the event time comes from
  ``time_fields`` of a JSON object (as for ``logjam``), else the arrival time.
- ``KeepAlive`` is echoed. ``ConditionalAppend`` is answered ``OperationUnsupported``: the
  router keeps no segment offsets a condition could be checked against (the
  ``currentSegmentWriteOffset`` of ``DataAppended`` counts bytes appended since start).
  Reads, transactions, scaling and table segments are not served (the controller says
  UNIMPLEMENTED; a read on this port is a decode error that closes the connection).
- Backpressure, TLS, limits, idle timeouts and the stop's drain are the stream base's.
"""

from __future__ import annotations

import socket
import uuid
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, list_of, one_of
from logrouter.pravega.controller_listen import check_controller_listen
from logrouter.pravega.streams import StreamRegistry, parse_segment_name
from logrouter.sources.acks import AckingConnection, AckingSource
from logrouter.sources.events import NANOS, TagTemplate, check_tag, time_from_fields
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.wire import json_text
from logrouter.wire import pravega as wire

MAX_WRITERS_PER_CONNECTION = 4096


class WriterState:
    """One writer's appends to one segment on this connection."""

    __slots__ = ("writer_id", "segment", "key", "tag", "acked", "ready")

    def __init__(self, writer_id: uuid.UUID, segment: str, tag: str) -> None:
        self.writer_id = writer_id
        self.segment = segment
        self.key = f"{segment}|{writer_id}".encode("utf-8")  # the router's writer id
        self.tag = tag
        self.acked = wire.NO_EVENT_NUMBER  # what the last DataAppended (or AppendSetup) said
        self.ready = False  # AppendSetup sent: appends may come


class PravegaProtocol(AckingConnection, StreamProtocol):
    log = Logger(namespace="logrouter.source.pravega")

    def __init__(self, source: "PravegaSource") -> None:
        super().__init__(source)  # self.acks: keyed by writer id, valued by (event number, request id, offset)
        self.writers: dict[uuid.UUID, WriterState] = {}
        self.version: int | None = None

    def make_decoder(self) -> wire.PravegaServerDecoder:
        return wire.PravegaServerDecoder()

    def unprocessed_bytes(self) -> int:
        pending = getattr(self.decoder, "pending_bytes", 0)
        return pending() if callable(pending) else pending

    def handle(self, message: Any) -> None:
        kind = message.__class__
        if kind is wire.Append:
            self._append(message)
        elif kind is wire.SetupAppend:
            self._setup(message)
        elif kind is wire.Hello:
            self._hello(message)
        elif kind is wire.KeepAlive:
            self.send(wire.encode_keep_alive())
        elif kind is wire.ConditionalAppend:
            self.send(wire.encode_operation_unsupported(message.request_id, "conditionalAppend", ""))
        else:  # the decoder yields nothing else; a bug must not pass silently
            self.reject(f"unexpected command {kind.__name__}")

    # -- hello and setup ------------------------------------------------------------------

    def _hello(self, hello: wire.Hello) -> None:
        self.send(wire.encode_hello(wire.WIRE_VERSION, wire.OLDEST_COMPATIBLE_VERSION))
        if hello.low_version > wire.WIRE_VERSION or hello.high_version < wire.OLDEST_COMPATIBLE_VERSION:
            self.reject(
                f"client speaks wire versions {hello.low_version}..{hello.high_version}, we speak "
                f"{wire.OLDEST_COMPATIBLE_VERSION}..{wire.WIRE_VERSION}"
            )
            return
        self.version = min(wire.WIRE_VERSION, hello.high_version)

    def _setup(self, setup: wire.SetupAppend) -> None:
        source: PravegaSource = self.source  # type: ignore[assignment]
        token = source.options["delegation_token"]
        if token and setup.delegation_token != token:
            source.auth_failures += 1
            self.send(wire.encode_auth_token_check_failed(setup.request_id, "", 0))
            self.reject(f"SetupAppend for {setup.segment} with a wrong delegation token")
            return
        stream = source.stream_of(setup.segment)
        if stream is None:
            source.unknown_segments += 1
            self.log.warn(
                "pravega {peer}: SetupAppend for unknown segment {segment}", peer=self.peer, segment=setup.segment
            )
            self.send(wire.encode_no_such_segment(setup.request_id, setup.segment, "", -1))
            return
        if setup.writer_id not in self.writers and len(self.writers) >= MAX_WRITERS_PER_CONNECTION:
            self.reject(f"more than {MAX_WRITERS_PER_CONNECTION} writers on one connection")
            return
        state = WriterState(setup.writer_id, setup.segment, source.tag_of(*stream))
        self.writers[setup.writer_id] = state
        # Appends of this writer still being stored (a connection that was cut) are
        # waited for: the answer must count exactly what is durable.
        settled = source.settled(state.key)

        def answer(_: Any) -> None:
            if self.closing or self.finishing or self.writers.get(setup.writer_id) is not state:
                return
            last = source.router.last_event_number(source.name, state.key)
            state.acked = wire.NO_EVENT_NUMBER if last is None else last
            state.ready = True
            self.send(wire.encode_append_setup(setup.request_id, setup.segment, setup.writer_id, state.acked))

        settled.addCallback(answer)

    # -- appends --------------------------------------------------------------------------

    def _append(self, append: wire.Append) -> None:
        source: PravegaSource = self.source  # type: ignore[assignment]
        state = self.writers.get(append.writer_id)
        if state is None or not state.ready:
            self.reject(f"append of writer {append.writer_id} without a completed SetupAppend")
            return
        if append.last_event_number <= state.acked:
            # Numbers already acknowledged: the router acks it without storing (its events
            # are not parsed again), and the ack repeats the level reached.
            source.stale_blocks += 1
            records = []
        else:
            records = source.records(append.events, state.tag)
        batch = Batch(state.tag, records, source.name, json_values=True)
        offset = source.appended(state.segment, append.size if records else 0)
        step = self.acks.add(append.writer_id, (append.last_event_number, append.request_id, offset), 1)
        d = source.router.ingest(batch, writer=(state.key, append.last_event_number))
        source.track(state.key, d)
        self.pending.add(d)

        def durable(_: Any) -> None:
            self.pending.discard(d)
            if not self.closing:
                self.acks.durable(step)

        def failed(failure: Any) -> None:
            self.pending.discard(d)
            self.store_failed(failure)

        d.addCallbacks(durable, failed)

    def encode_ack(self, writer_id: Any, value: tuple[int, int, int]) -> bytes:
        event_number, request_id, offset = value
        state = self.writers.get(writer_id)
        previous = wire.NO_EVENT_NUMBER
        if state is not None:
            previous = state.acked
            event_number = state.acked = max(state.acked, event_number)  # acks never go back
        return wire.encode_data_appended(writer_id, event_number, previous, request_id, offset)

    def encode_keepalive(self, key: Any, acked: int) -> bytes:
        return b""  # the server never speaks first (it only echoes the client's KeepAlive)


@registry.source("pravega")
class PravegaSource(AckingSource, StreamSource):
    SHAREABLE = False  # its controller and stream registry belong to one process
    protocol_class = PravegaProtocol
    log = Logger(namespace="logrouter.source.pravega")
    COUNTERS = {
        "invalid_events": "event payloads that did not parse as `payload` says (sent to the error path)",
        "unknown_segments": "SetupAppend for a segment of no stream created here (answered NoSuchSegment)",
        "auth_failures": "SetupAppend with a wrong delegation token",
        "stale_blocks": "append blocks whose event numbers were already acknowledged on the connection",
        **StreamSource.COUNTERS,
    }
    OPTIONS = {
        **StreamSource.OPTIONS,
        "listen": listen_option("tcp:12345", "Twisted server endpoint string of the segment store (Pravega's port is 12345)"),
        "controller_listen": Option(
            str, "tcp:9090", "the gRPC controller's endpoint (`tcp:PORT[:interface=…]` or `ssl:…`); clients are pointed "
            "at `tcp://host:PORT` of it; empty = no controller", lambda v: check_controller_listen(v) if v else None,
        ),
        "advertise_host": Option(
            str, "", "host name the controller gives clients for the segment store (empty = the listen interface, or "
            "this host's FQDN when listening on all interfaces)"
        ),
        "payload": Option(str, "json", "how an event's bytes are read: `json`, `string` (UTF-8) or `bytes`", one_of("json", "string", "bytes")),
        "tag": Option(str, "${scope}.${stream}", "the batches' tag; `${scope}` and `${stream}` insert the stream's", check_tag),
        "time_fields": Option(
            list, [], "fields of a JSON object payload that give the event time, first found wins (number = ms since "
            "the epoch, string = RFC 3339); else the arrival time", list_of(str),
        ),
        "delegation_token": Option(str, "", "a static token SetupAppend must carry (given to clients by the controller); empty = none"),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.invalid_events = 0
        self.unknown_segments = 0
        self.auth_failures = 0
        self.stale_blocks = 0
        self.tag_template = TagTemplate(self.options["tag"])
        self._tags: dict[tuple[str, str], str] = {}
        self.time_fields = tuple(self.options["time_fields"])
        self.payload = self.options["payload"]
        self.streams: StreamRegistry | None = None
        self.controller: Any = None  # a pravega.controller.ControllerServer once started
        self.controller_port: int | None = None
        self.segment_store_address: tuple[str, int] | None = None  # (host, port) once listening
        self.offsets: dict[str, int] = {}
        self.inflight: dict[bytes, set[defer.Deferred]] = {}

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        import os

        state = self.context.state_path(self.name)
        os.makedirs(state, exist_ok=True)
        self.streams = StreamRegistry(os.path.join(state, "streams.json"))
        d = super().start()
        return d.addCallback(lambda _: self._start_controller())

    def port_opened(self, port: Any) -> None:
        address = port.getHost()
        host = self.options["advertise_host"] or getattr(address, "host", "") or ""
        if not self.options["advertise_host"] and host in ("", "0.0.0.0", "::"):
            host = socket.getfqdn()
        self.segment_store_address = (host, getattr(address, "port", 0))

    def segment_store(self) -> tuple[str, int] | None:
        """Where writers append (the controller's getURI answer); None until listening."""
        return self.segment_store_address

    def _start_controller(self) -> None:
        listen = self.options["controller_listen"]
        if not listen:
            return
        from logrouter.pravega.controller import ControllerServer  # grpcio: only where a controller runs

        self.controller = ControllerServer(
            self.streams, self.segment_store, self.options["delegation_token"], advertise_host=self.options["advertise_host"] or None
        )
        self.controller_port = self.controller.start(listen)
        self.log.info(
            "pravega source {name} controller listening on port {port} (segment store advertised as {host}:{store})",
            name=self.name, port=self.controller_port, host=self.segment_store_address[0] if self.segment_store_address else "?",
            store=self.segment_store_address[1] if self.segment_store_address else "?",
        )

    def stop(self) -> defer.Deferred:
        d = super().stop()
        controller = self.controller
        if controller is not None:
            self.controller = None
            # also when the stream stop failed: a port left bound would refuse the restart
            d.addBoth(lambda result: self.context.run_in_thread(controller.stop, 1.0).addBoth(lambda _: result))
        return d

    # -- what the connections share -------------------------------------------------------

    def stream_of(self, segment: str) -> tuple[str, str] | None:
        """(scope, stream) of a segment of a stream created here, else None."""
        assert self.streams is not None
        try:
            scope, stream, _number, _epoch = parse_segment_name(segment)
        except ValueError:
            return None
        if not self.streams.has_segment(segment):
            return None
        return scope, stream

    def tag_of(self, scope: str, stream: str) -> str:
        tag = self._tags.get((scope, stream))
        if tag is None:
            tag = self._tags[(scope, stream)] = self.tag_template.render({"scope": scope, "stream": stream})
        return tag

    def appended(self, segment: str, size: int) -> int:
        """The segment's write offset after ``size`` more bytes (counted since start)."""
        offset = self.offsets.get(segment, 0) + size
        self.offsets[segment] = offset
        return offset

    def track(self, writer_key: bytes, d: defer.Deferred) -> None:
        """Remember an append of ``writer_key`` being stored, until it settles."""
        waiting = self.inflight.setdefault(writer_key, set())
        waiting.add(d)

        def settled(result: Any) -> Any:
            waiting.discard(d)
            if not waiting and self.inflight.get(writer_key) is waiting:
                del self.inflight[writer_key]
            return result

        d.addBoth(settled)

    def settled(self, writer_key: bytes) -> defer.Deferred:
        """Fires once no append of ``writer_key`` is being stored (at once if none is)."""
        waiting = self.inflight.get(writer_key)
        if not waiting:
            return defer.succeed(None)
        return defer.DeferredList([_observe(d) for d in waiting], consumeErrors=True)

    def records(self, payloads: tuple[bytes, ...], tag: str) -> list[tuple[int, dict[str, Any]]]:
        """The events of one block; payloads that do not parse go to the error path."""
        now = int(self.reactor.seconds() * NANOS)
        events: list[tuple[int, dict[str, Any]]] = []
        append = events.append
        mode = self.payload
        for payload in payloads:
            try:
                if mode == "json":
                    value = json_text.loads(payload)
                    if value.__class__ is dict:
                        t = time_from_fields(value, self.time_fields, now) if self.time_fields else now
                        append((t, value))
                    else:
                        append((now, {"value": value}))
                elif mode == "string":
                    append((now, {"message": payload.decode("utf-8")}))
                else:
                    append((now, {"data": bytes(payload)}))
            except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                self.invalid_events += 1
                reason = f"event payload is not {'JSON' if mode == 'json' else 'UTF-8'}: {e}"
                self.context.errors(self.name, tag, {"payload": bytes(payload)}, reason)
        return events


def _observe(d: defer.Deferred) -> defer.Deferred:
    """A Deferred that fires when ``d`` does, without touching ``d``'s result chain."""
    out: defer.Deferred = defer.Deferred()

    def fire(result: Any) -> Any:
        out.callback(None)
        return result

    d.addBoth(fire)
    return out
