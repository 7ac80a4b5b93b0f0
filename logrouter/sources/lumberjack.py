"""The ``lumberjack`` source: the Beats/Lumberjack protocol (Logstash's ``beats`` input), v1 and v2.

Per connection it keeps the windows the client announced and the events stored for
them, and answers with ``A`` frames only once events are durable:

- Each ``Events`` group the codec returns (the data frames of one window that one read
  completed: a whole ``C`` frame, or the plain frames that arrived together) is handed to
  the router at once, split into one batch per tag. A window that arrives over several
  reads is therefore stored in several steps, and each step that becomes durable is
  acknowledged with the highest ``seq`` it covers (a partial ack; Beats re-sends only
  what follows it after a failure). Acks go out strictly in arrival order, one per
  window touched, never across windows, and carry the connection's version byte.
- An empty window (``W`` 0) is answered with ``A`` 0, after the windows before it.
- While events are stored but not acknowledged, ``A`` 0 is written every
  ``keepalive_secs`` in which nothing else was written (Logstash's keepalive; it re-arms
  the Beats read timeout).
- A batch the router fails to store closes the connection: the client re-sends every
  event that was not acknowledged.
- Lumberjack has no batch id, so a resent event is recognised by its own key
  (``idempotency_key``, ``logrouter.sources.event_keys``), taken before ``@metadata`` may
  be dropped and handed to the router with each batch (``Router.ingest(events=…)``): the
  events it stored already are acked and left out (docs/beats-exactly-once.md).
- Bad input (a framing error, or a frame over ``max_frame_bytes``, ``max_event_bytes``,
  ``max_data_fields``, ``max_window_size``, ``max_decompressed_bytes``) closes the
  connection with a log line naming the limit. The events the same read brought before
  it are stored and acknowledged first; a bad ``C`` frame gives none of its events.

The spool stores a batch as the documents it was read from (``json-documents``), or,
when the batch is all of a window's events and they came in ``C`` frames holding
nothing else, as those frames' compressed payloads (``lumberjack-zlib``,
``logrouter.sources.compressed_documents``): ~25 times fewer bytes to write for
Filebeat's windows. Either replays to the same events.

Events become ``(time_ns, record)``: the JSON object of a ``J`` frame (the key/value
strings of a ``D`` frame) with its fields intact, the time taken from ``@timestamp``
(RFC 3339) when it parses, else the time of arrival. The tag is the ``tag`` option, which
may refer to event fields (``"beats.${@metadata.beat}"``, see ``TagTemplate``).
"""

from __future__ import annotations

from typing import Any

from logrouter import dedupe, registry
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, non_negative, positive
from logrouter.sources import event_keys
from logrouter.sources.acks import AckingConnection, AckingSource
from logrouter.sources.compressed_documents import LUMBERJACK_ZLIB, store_compressed
from logrouter.sources.json_native import NativeReads
from logrouter.sources.events import NANOS, TagTemplate, batch_builder, check_tag, timestamp_ns  # noqa: F401 - re-exported
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.wire import lumberjack as wire

# -- the protocol ------------------------------------------------------------------------


class LumberjackProtocol(AckingConnection, StreamProtocol):
    # self.acks: steps in arrival order, keyed by window serial, valued by the highest seq they cover.

    def make_decoder(self) -> wire.LumberjackDecoder:
        options = self.source.options
        return wire.LumberjackDecoder(
            max_window_size=options["max_window_size"],
            max_frame_bytes=options["max_frame_bytes"],
            max_decompressed_bytes=options["max_decompressed_bytes"],
            max_event_bytes=options["max_event_bytes"],
            max_data_fields=options["max_data_fields"],
            keep_documents=True,  # left undecoded for the native read (_events), where installed
        )

    def handle(self, message: wire.Window | wire.Events) -> None:
        if message.__class__ is wire.Events:
            self._events(message)  # type: ignore[arg-type]
            return
        window: wire.Window = message  # type: ignore[assignment]
        if window.missing:
            self.log.warn(
                "lumberjack {peer}: window {window} started while the previous one still lacked "
                "{missing} event(s); the previous window is taken as complete",
                peer=self.peer,
                window=window.window,
                missing=window.missing,
            )
        if window.size == 0:
            self.acks.add(window.window, 0)  # A 0, after the windows before it

    def _events(self, message: wire.Events) -> None:
        source: LumberjackSource = self.source  # type: ignore[assignment]
        now = int(source.reactor.seconds() * NANOS)
        read = None
        # The spool stores the C frames' payloads as they came when they hold all of it.
        compressed = message.payload_frames if message.payload_frames == message.frames else -1
        if message.undecoded:
            # The documents as received: read natively where the extension takes them all
            # (one batch), else decoded here (counting those that are no JSON object).
            whole = (message.payloads, message.inflated_bytes) if message.payloads and compressed >= 0 else None
            read = source.native_reads.read_runs(message.runs, now, whole)
            if read is None:
                wire.decode_group(message)
        if message.invalid:
            source.invalid_events += message.invalid
            self.log.warn(
                "lumberjack {peer}: skipped {count} invalid event(s) in window {window} ({reason})",
                peer=self.peer,
                count=message.invalid,
                window=message.window,
                reason=message.invalid_reason,
            )
        if read is not None:
            batch, keys = read
            store_compressed(batch, LUMBERJACK_ZLIB, message.payloads, message.inflated_bytes, compressed)
            step = self.acks.add(message.window, message.ack_seq, 1)
            self.submit(batch, self.acks.on_durable(step), events=keys)
            return
        documents = message.documents if message.documents_match else None
        records = message.records
        # Keys first: the batches may drop @metadata, which holds _id.
        keys = source.event_keys(records) if source.event_keys is not None and records else None
        batches = source.batches(records, now, documents)
        if len(batches) == 1:
            store_compressed(batches[0], LUMBERJACK_ZLIB, message.payloads, message.inflated_bytes, compressed)
        step = self.acks.add(message.window, message.ack_seq, len(batches))
        if keys is None:
            for batch in batches:
                self.submit(batch, self.acks.on_durable(step))
            return
        if len(batches) == 1:
            self.submit(batches[0], self.acks.on_durable(step), events=keys)
            return
        key_of = {id(record): key for record, key in zip(records, keys)}
        for batch in batches:
            self.submit(batch, self.acks.on_durable(step), events=[key_of[id(record)] for _, record in batch.events])

    # -- acknowledging (logrouter.sources.acks) ------------------------------------------

    def encode_ack(self, window: int, value: int) -> bytes:
        return wire.encode_ack(value, self.decoder.version or 2)

    def encode_keepalive(self, window: Any, acked: int) -> bytes:
        # Logstash writes '2' here even to v1 peers; the Node v1 client rejects that,
        # so the connection's own version byte is used (docs/protocols/lumberjack.md section 9).
        return wire.encode_ack(0, self.decoder.version or 2)

    def stalled_by_us(self) -> bool:
        """Reading is paused (backpressure) while the client is in the middle of a window.

        Beats then waits for an ack we cannot give yet; ACK 0 keeps it from timing out
        after 30 s and resending. Only for v2: the v1 Node client reads ACK 0 as a reset.
        """
        return self.source.paused and self.decoder.version == 2 and self.decoder.window_incomplete


# -- the source --------------------------------------------------------------------------


@registry.source("lumberjack")
class LumberjackSource(AckingSource, StreamSource):
    protocol_class = LumberjackProtocol
    COUNTERS = {"invalid_events": "events skipped (a J payload that is not a JSON object)", **StreamSource.COUNTERS}
    OPTIONS = {
        **StreamSource.OPTIONS,
        "listen": listen_option("tcp:5044"),
        "tag": Option(str, "beats", "the batches' tag; `${field}` and `${field:-default}` insert event fields, e.g. `\"beats.${@metadata.beat}\"`", check_tag),
        "keep_metadata": Option(bool, True, "keep the `@metadata` object in records (`false`: drop it once the tag is made)"),
        "keepalive_secs": Option(
            (int, float), 5, "write `ACK 0` this often while stored events wait for their ack (0 = never)", non_negative
        ),
        "max_window_size": Option(int, wire.DEFAULT_MAX_WINDOW_SIZE, "largest window (`W`) accepted; a larger one closes the connection (go-lumber's default)", positive),
        "max_frame_bytes": Option(int, wire.DEFAULT_MAX_FRAME_BYTES, "largest `J`, `D` or `C` frame accepted", positive),
        "max_decompressed_bytes": Option(
            int, wire.DEFAULT_MAX_DECOMPRESSED_BYTES, "largest inflated content of one `C` frame, nested frames included", positive
        ),
        "max_event_bytes": Option(
            int,
            wire.DEFAULT_MAX_EVENT_BYTES,
            "largest single event: the JSON document of a `J` frame, a whole `D` frame (checked inside `C` frames too)",
            positive,
        ),
        "max_data_fields": Option(
            int, wire.DEFAULT_MAX_DATA_FIELDS, "most key/value pairs in one v1 `D` frame (one event)", positive
        ),
        "idempotency_key": Option(
            (str, list),
            event_keys.AUTO,
            "what names an event its sender may send again, so that it is stored once: `\"auto\"` "
            "(`@metadata._id`, else Filebeat's `agent.ephemeral_id`, `log.file.path`, `log.offset` and "
            "`@timestamp`), `\"off\"`, or a list of field paths (see docs/beats-exactly-once.md)",
            event_keys.check_spec,
        ),
        "idempotency_window": Option(
            int,
            dedupe.EVENTS_PER_SENDER,
            "events remembered per sender (`agent.id`) to recognise its resends; more than it may hold "
            "unacknowledged (Filebeat: `queue.mem.events`)",
            positive,
        ),
        "idempotency_senders": Option(
            int, dedupe.SENDERS, "senders (`agent.id`) whose events are remembered; the least recently seen is forgotten first", positive
        ),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.invalid_events = 0
        self.tag_template = TagTemplate(self.options["tag"])
        self.batches = batch_builder(self.tag_template, drop_metadata=not self.options["keep_metadata"])
        self.event_keys = event_keys.key_maker(self.options["idempotency_key"])
        self.native_reads = NativeReads(
            self.tag_template, not self.options["keep_metadata"], self.options["idempotency_key"]
        )

