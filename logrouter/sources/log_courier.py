"""The ``log_courier`` source: the Log Courier ("courier") protocol, as Log Carver serves it.

Point a Log Courier shipper (``network.transport`` ``tcp`` or ``tls``) at it. The wire is
``logrouter.wire.log_courier``; what this module adds (``docs/protocols/log_courier.md``):

- **Handshake** (the stream base's hook): a ``HELO`` first gets ``VERS`` with the EVNT bit
  set, so the shipper streams its payloads (``EVNT``); a first ``JDAT``/``EVNT`` is a client
  from before the handshake and is served as is; any other first message closes the
  connection. A later ``HELO``, and any type the codec skipped as unknown, is answered
  with ``????`` (the Ruby server's leniency; Log Carver closes instead).
- **Acks mean durable, in order.** Each payload (its 16-byte nonce and its events) is
  stored as one batch per tag; ``ACKN nonce N`` goes out once all of them are durable, in
  payload arrival order (``logrouter.sources.acks``), while several payloads are in
  flight. While payloads wait, the current count of the oldest one (often 0) is repeated
  every ``keepalive_secs`` in which nothing was written, as Log Carver does every 5 s: it
  re-arms the shipper's network timeout. The same goes for a payload whose reading
  backpressure paused half way (its nonce is known): ``ACKN nonce 0``.
- **Held back at a payload boundary:** when the router stops reading just after a whole
  payload, the shipper (up to ``max pending payloads`` in flight) may already have sent
  the next ones and waits for their ``ACKN``; an ACKN of a payload it no longer holds does
  not re-arm its timeout, so without the next nonce it would give up after its network
  timeout (15 s) and reconnect. The connection therefore reads on, while held, until the
  next payload's nonce has arrived or ``PEEK_BYTES`` were read (the read that passes it is
  the last; payloads completed meanwhile are stored as usual), then stops and keeps that
  payload alive with ``ACKN nonce 0``. One such peek per hold.
- **Retransmissions:** the shipper resends a payload it has no full ``ACKN`` for with the
  same nonce after a reconnect; the nonce is the payload's idempotency key, so it is
  acknowledged without being stored twice.
- ``PING`` gets ``PONG`` (also while acks are owed: Log Carver would close, a shipper that
  pings then is only checking the line).
- Events: each JSON object is a record; ``@timestamp`` gives the event time and ``tag``
  (a template, as for ``lumberjack``) the batch's tag (``logrouter.sources.events``). A
  record that is not a JSON object is kept as ``{"message": text}`` and counted.
- **Stored as it arrived:** a payload that makes one batch of JSON objects is stored as
  its zlib stream, compressed as the shipper sent it (``log-courier-zlib``,
  ``logrouter.sources.compressed_documents``); one split by tag or with a record that is
  no object, as its documents or its records.
"""

from __future__ import annotations

import struct
from typing import Any

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, non_negative, positive
from logrouter.sources.acks import AckingConnection, AckingSource
from logrouter.sources.compressed_documents import LOG_COURIER_ZLIB, store_compressed
from logrouter.sources.events import NANOS, TagTemplate, batch_builder, check_tag
from logrouter.sources.json_native import NativeReads
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.sources.stream_handshake import HandshakeDone, HandshakeFailed
from logrouter.wire import log_courier as wire

_HEADER = struct.Struct(">4sI")
SERVER_ID = b"LGRT"  # our 4-byte id in VERS (Log Carver says LCVR, the Ruby server RYLC)
SERVER_VERSION = (2, 12, 0)  # the protocol level we speak: Log Carver 2.12's
BACKPRESSURE = "backpressure"  # the stream base's hold while the router cannot take more
PEEK_BYTES = 65536  # held: read no more than this for the next nonce (Twisted reads 64 KiB at once)


class LogCourierProtocol(AckingConnection, StreamProtocol):
    client_id = ""  # from the HELO; "" for a client from before the handshake

    def __init__(self, source: "LogCourierSource") -> None:
        super().__init__(source)  # self.acks: keyed by nonce, valued by the events processed
        self._greeting = b""  # the first message, while it is incomplete
        self.greeted = False  # the handshake (or a client's first payload) has come
        self.peek_left: int | None = None  # reading on while held: the bytes it may still take
        self.peeked = False  # this hold had its peek: no other until reading resumes

    def make_decoder(self) -> wire.LogCourierDecoder:
        options = self.source.options
        return wire.LogCourierDecoder(
            max_payload_bytes=options["max_payload_bytes"],
            max_event_bytes=options["max_event_bytes"],
            max_decompressed_bytes=options["max_decompressed_bytes"],
            keep_documents=True,  # left undecoded for the native read (_payload), where installed
        )

    def connection_ready(self) -> None:
        self.expect_handshake()

    # -- handshake (HELO -> VERS) ----------------------------------------------------------

    def handshake_received(self, data: bytes) -> HandshakeDone | HandshakeFailed | None:
        greeting = self._greeting + data
        if len(greeting) < _HEADER.size:
            self._greeting = greeting
            return None
        code, length = _HEADER.unpack_from(greeting)
        if code in (wire.JDAT, wire.EVNT):
            self._greeting = b""
            self.greeted = True
            return HandshakeDone(rest=greeting)  # a client from before the handshake
        if code != wire.HELO:
            shown = code.decode("ascii", "backslashreplace")
            return HandshakeFailed(f"first message is {shown!r}, expected HELO (or JDAT/EVNT)", b"")
        if length > wire.HANDSHAKE_BYTES:
            return HandshakeFailed(f"HELO body of {length} bytes (at most {wire.HANDSHAKE_BYTES})", b"")
        end = _HEADER.size + length
        if len(greeting) < end:
            self._greeting = greeting
            return None
        self._greeting = b""
        (helo,) = wire.LogCourierDecoder().feed(greeting[:end])
        self.client_id = helo.client_id or "unknown"
        self.greeted = True
        vers = wire.encode_vers(True, SERVER_VERSION, SERVER_ID)
        return HandshakeDone(rest=greeting[end:], reply=vers)

    def handshake_pending_bytes(self) -> int:
        return len(self._greeting)  # a HELO dribbled in is cut off by the frame deadline

    # -- messages ----------------------------------------------------------------------------

    def handle(self, message: Any) -> None:
        kind = message.__class__
        if kind is wire.Payload:
            self._payload(message)
        elif kind is wire.Ping:
            self.send(wire.encode_pong())
        else:
            source: LogCourierSource = self.source  # type: ignore[assignment]
            source.unknown_messages += 1
            if kind is not wire.Unknown:
                # A HELO after the first message, or a type the codec skipped: say so. A
                # client's own ???? is not answered in kind, or two peers could bounce it forever.
                self.send(wire.encode_unknown())

    def _payload(self, payload: wire.Payload) -> None:
        source: LogCourierSource = self.source  # type: ignore[assignment]
        now = int(source.reactor.seconds() * NANOS)
        if payload.undecoded:
            # The records as received: read natively where the extension takes them all
            # (one batch), else decoded here (keeping those that are no JSON object as text).
            read = source.native_reads.read(payload.documents, now)
            if read is not None:
                self._store_compressed(read[0], payload)
                step = self.acks.add(payload.nonce, len(payload.events), 1)
                self.submit(read[0], self.acks.on_durable(step), payload.nonce)
                return
            wire.decode_payload(payload)
        if payload.invalid:
            source.invalid_events += payload.invalid
            self.log.warn(
                "log_courier {peer}: {count} event(s) of payload {nonce} are not JSON objects ({reason}); "
                "kept as {{\"message\": text}}",
                peer=self.peer,
                count=payload.invalid,
                nonce=payload.nonce.hex(),
                reason=payload.invalid_reason,
            )
        # An invalid record is kept as {"message": text}, which no document gives: then the
        # batches are stored as records.
        documents = None if payload.invalid else payload.documents
        batches = source.batches(payload.events, now, documents)
        if len(batches) == 1:
            self._store_compressed(batches[0], payload)
        step = self.acks.add(payload.nonce, len(payload.events), len(batches))
        for batch in batches:
            self.submit(batch, self.acks.on_durable(step), self._key(payload.nonce, batch, len(batches)))

    @staticmethod
    def _store_compressed(batch: Batch, payload: wire.Payload) -> None:
        """The spool stores the payload's zlib stream as it came, when the batch is all of it."""
        compressed = [] if payload.compressed is None else [payload.compressed]
        store_compressed(batch, LOG_COURIER_ZLIB, compressed, payload.inflated_bytes, len(payload.events))

    @staticmethod
    def _key(nonce: bytes, batch: Batch, count: int) -> bytes:
        # A payload split by tag is stored as several batches: each its own id, the same
        # on every resend (the split is a function of the payload).
        return nonce if count == 1 else nonce + b"\0" + batch.tag.encode("utf-8", "surrogateescape")

    # -- acknowledging ----------------------------------------------------------------------

    def encode_ack(self, nonce: bytes, count: int) -> bytes:
        return wire.encode_ackn(nonce, count)

    def encode_keepalive(self, nonce: Any, count: int) -> bytes:
        if nonce is None:  # nothing stored waits: the payload we stopped reading does
            nonce = self.decoder.nonce_in_progress
        return b"" if nonce is None else wire.encode_ackn(nonce, count)

    # -- held back at a payload boundary ------------------------------------------------

    def hold_reading(self, reason: str) -> None:
        super().hold_reading(reason)
        if self.peek_left is not None and reason != BACKPRESSURE:
            self._end_peek()  # another hold (a stop, a close) wants reading stopped for real
        else:
            self._peek()

    def release_reading(self, reason: str) -> None:
        super().release_reading(reason)
        if not self.holds:
            self.peek_left = None
            self.peeked = False
        else:
            self._peek()

    def _peek(self) -> None:
        """Held back by the router alone, after the greeting, between payloads: read on
        until the next payload's nonce is known, so it can be kept alive."""
        if (
            self.peek_left is None
            and not self.peeked
            and self.holds == {BACKPRESSURE}
            and self.greeted
            and not (self.closing or self.finishing)
            and self.decoder.nonce_in_progress is None
            and self.transport is not None
        ):
            self.peek_left = PEEK_BYTES
            self.transport.resumeProducing()

    def _end_peek(self) -> None:
        self.peek_left = None
        self.peeked = True
        if self.holds and not self.closing and self.transport is not None:
            self.transport.pauseProducing()
        if self.stalled_by_us():
            self.acks.wait_began()

    def dataReceived(self, data: bytes) -> None:
        super().dataReceived(data)
        if self.peek_left is not None:
            self.peek_left -= len(data)
            if self.peek_left <= 0 or self.decoder.nonce_in_progress is not None or self.closing or self.finishing:
                self._end_peek()

    def stalled_by_us(self) -> bool:
        """Reading is paused (backpressure) in the middle of a payload: the shipper waits for
        an ACKN we cannot give yet, and would time out and resend without a partial one."""
        return self.source.paused and self.decoder.nonce_in_progress is not None


@registry.source("log_courier")
class LogCourierSource(AckingSource, StreamSource):
    protocol_class = LogCourierProtocol
    COUNTERS = {
        "invalid_events": "events that were not JSON objects (kept as {message: text})",
        "unknown_messages": "messages not understood: unknown types and a late HELO (answered with ????), a client's ????",
        **StreamSource.COUNTERS,
    }
    OPTIONS = {
        **StreamSource.OPTIONS,
        "listen": listen_option("tcp:5043"),
        "tag": Option(str, "log_courier", "the batches' tag; ${field} and ${field:-default} insert event fields", check_tag),
        "keepalive_secs": Option(
            (int, float), 5, "repeat the oldest waiting payload's ACKN this often while acks are owed (0 = never)",
            non_negative,
        ),
        "max_payload_bytes": Option(
            int, wire.DEFAULT_MAX_PAYLOAD_BYTES, "largest JDAT body, or EVNT nonce plus compressed stream", positive
        ),
        "max_event_bytes": Option(int, wire.DEFAULT_MAX_EVENT_BYTES, "largest single event (one JSON record)", positive),
        "max_decompressed_bytes": Option(
            int, wire.DEFAULT_MAX_DECOMPRESSED_BYTES, "largest inflated content of one payload", positive
        ),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.invalid_events = 0
        self.unknown_messages = 0
        template = TagTemplate(self.options["tag"])
        self.batches = batch_builder(template)
        self.native_reads = NativeReads(template, False)
