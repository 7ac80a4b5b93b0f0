"""The ``logjam`` source: logjam messages over ZeroMQ, as an importer and as a device.

logjam (the Rails performance pipeline) moves JSON request logs as 4-frame ZeroMQ
messages (``docs/protocols/logjam.md``; codec ``logrouter.wire.logjam``). This source takes
them three ways, in any combination:

* ``connect``: a SUB socket per device endpoint (``tcp://device:9606``), subscribed to
  everything or to ``subscriptions`` (app-env prefixes; ``heartbeat`` is added, as the
  importer does). PUB/SUB cannot push back or resend, so every loss is *counted*: each
  message's (endpoint, device number, sequence) goes through a ``SequenceTracker``: gaps
  are lost messages, a step back is a duplicate (dropped) or a device restart (logged
  once), heartbeats take their sequence number too and keep a device alive; an endpoint
  whose devices were all silent for ``silence_secs`` (the importer's 30 s) is
  disconnected and connected again. The C importer has one SUB socket for all devices,
  so it maps the endpoint a device's heartbeat announced back to a configured one to
  know what to reconnect (and refuses unknown ones); with a socket per configured
  endpoint the silent socket is known, and the announced endpoints go into the log line. With ``subscriptions`` set, the device still numbers
  the streams we did not subscribe to, so gaps are only exact with everything subscribed.
* ``listen_router``: a ROUTER socket for DEALER agents. A request-reply message (empty
  first frame) gets ``<app-env>``, ``202 Accepted`` only **once it is durable** (the C
  device answers on receipt); a ``ping`` with valid meta gets ``ping``, ``200 OK``, our
  FQDN at once; a bad request gets ``<first frame>``, ``400 Bad Request`` at once, as
  does one the spool refuses as unstorable. Messages without the empty frame get no reply.
* ``listen_pull``: a PULL socket for PUSH agents (fire and forget); 3-frame messages of
  legacy producers (no meta) are taken as uncompressed with the arrival time.

Each data message becomes one event: the JSON body as the record, plus the fields
``<metadata_prefix>app``, ``…env``, ``…topic``, ``…device`` and ``…sequence`` (default
prefix ``logjam_``: flat fields, so they are typed columns in the lake; the ``logjam``
sink publishes a record under them again). The event time is the body's first ``time_fields``
entry that holds one (a number is ms since the epoch, as ``started_ms``; a string is
RFC 3339, as ``started_at``), else the meta's ``created_ms``, else the arrival time. The
tag renders ``tag`` over ``app``, ``env`` and ``topic``.

With the native extension a body stays undecoded from the socket to the lake
(``logjam_native``): the receiver thread reads it natively into the event's entry
instead of decoding it, a batch joins its messages' entries, and the spool stores the
bodies as they arrived (``logjam-bodies``); without it, or for a body the extension does
not take, the Python path above.

What arrives together is stored per tag in batches of at most ``BATCH_BYTES`` of body
JSON (``split_by_size``), each one spool record: a record has a size limit
(``MAX_PAYLOAD``), and one past it would be refused whole, however valid each message in
it. A batch the spool still refuses (an estimate that fell short, a value msgpack cannot
hold) is stored again in halves, so ``400 Bad Request`` goes only to a message that
cannot be stored by itself.

Bad messages (wrong frame count, bad meta, unknown compression, a body over the limits or
a decompression bomb, not a JSON object) are dropped one by one, counted per reason
(``logrouter_logjam_dropped_messages_total``) and logged at a bounded rate; the sockets go
on. Sockets, decoding and the hand-off to the reactor live in ``zmq_receiver``: the
reactor only gets bounded chunks of decoded (or natively read) messages.

Backpressure: paused by the router, the receiver stops reading; ZeroMQ's queues fill
(``receive_hwm``), then a device's PUB drops what we cannot take (counted as gaps when
reading resumes) and PUSH/DEALER agents wait. A graceful stop reads on until the sockets
are quiet (``stop_quiet_secs``, bounded by ``stop_drain_secs``), lets what was stored get
its replies, then closes.
"""

from __future__ import annotations

import socket
from typing import Any, Iterator

from twisted.internet import defer, task
from twisted.logger import Logger

from logrouter import registry
from logrouter.config.options import Option, list_of, positive
from logrouter.config.zmq_endpoints import bind_option, check_connect_endpoints
from logrouter.failures import UnstorableBatch
from logrouter.sources.base import Sample, SourceBase
from logrouter.sources.drops import DroppedMessages
from logrouter.sources.events import NANOS, TagTemplate, check_tag
from logrouter.sources.logjam_native import LogjamBatches, ScannedMessage
from logrouter.sources.sequence import DEFAULT_SILENCE_SECS, SequenceTracker, Verdict
from logrouter.sources.stream import STREAM_OPTIONS
from logrouter.sources.zmq_receiver import PULL, ROUTER, SUB, Received, SocketSpec, ZmqReceiver
from logrouter.spool.segment import MAX_PAYLOAD
from logrouter.wire import logjam as wire
from logrouter.wire.errors import detached

#: how often silence is checked: the importer's heartbeat tick (5 one-second ticks)
LIVENESS_SECS = 5.0
_STOP_POLL_SECS = 0.05
#: body JSON per stored batch. A JSON document packs into msgpack at most ~2.3 times its
#: text (a short float, ``1.5,``, takes 9 bytes): an eighth of the record limit leaves
#: room for that and the metadata fields; a batch refused anyway is split again.
BATCH_BYTES = MAX_PAYLOAD // 8
#: what a message adds to its batch besides its body (metadata fields, time, framing)
MESSAGE_OVERHEAD_BYTES = 128


def split_by_size(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """``(start, end)`` ranges of consecutive items whose sizes add up to at most
    ``budget``; an item bigger than the budget is a range of its own."""
    ranges: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if total + size > budget and i > start:
            ranges.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges


class Ping:
    """A ROUTER ping: answered ``200 OK`` when its meta is valid."""

    __slots__ = ("valid",)

    def __init__(self, valid: bool) -> None:
        self.valid = valid


class Request:
    """A decoded ROUTER/PULL/SUB message and whether (and with what) a reply is owed."""

    __slots__ = ("decoded", "reply_first", "size")

    def __init__(self, decoded: Any, reply_first: bytes | None, size: int = 0) -> None:
        self.decoded = decoded  # LogjamMessage, ScannedMessage, Heartbeat, Ping or LogjamDecodeError
        self.reply_first = reply_first  # the frame a reply echoes; None = no reply owed
        self.size = size  # the body's JSON text, decompressed (what batches are sized by)


def _legacy_frames(frames: list[bytes], now_ms: int) -> list[bytes]:
    """A 3-frame PULL message of a producer from before meta-info, with the meta the device makes."""
    return [*frames, wire.encode_meta(wire.Meta(wire.NONE, 0, now_ms, 0))]


def _time_field_checker(value: list[Any]) -> None:
    list_of(str)(value)
    if any(not name for name in value):
        raise ValueError("field names must not be empty")


@registry.source("logjam")
class LogjamSource(SourceBase):
    log = Logger(namespace="logrouter.source.logjam")

    OPTIONS = {
        "connect": Option(
            list, [], "device PUB endpoints to subscribe to (`tcp://host:9606`), one SUB socket each",
            check_connect_endpoints,
        ),
        "subscriptions": Option(
            list, [], "app-env prefixes to subscribe to (`heartbeat` is added); empty = everything "
            "(gap counts are exact only then: a device numbers every stream)", list_of(str),
        ),
        "listen_router": bind_option("", "ROUTER endpoint for DEALER agents (`tcp://*:9604`); replies `202 Accepted` once durable; empty = off"),
        "listen_pull": bind_option("", "PULL endpoint for PUSH agents (`tcp://*:9605`); empty = off"),
        "tag": Option(str, "logjam.${app}.${env}", "the batches' tag; `${app}`, `${env}` and `${topic}` insert the message's", check_tag),
        "metadata_prefix": Option(
            str, "logjam_", "each record gets `<prefix>app`, `…env`, `…topic`, `…device` and `…sequence` of its message "
            "(they replace body fields of those names; empty = none)"
        ),
        "time_fields": Option(
            list, ["started_ms", "started_at"], "body fields that give the event time, first found wins "
            "(number = ms since the epoch, string = RFC 3339); else the meta's created_ms", _time_field_checker,
        ),
        "max_body_bytes": Option(int, 16 << 20, "largest body frame as received; bigger messages are dropped and counted", positive),
        "max_decompressed_bytes": Option(
            int, wire.DEFAULT_MAX_DECOMPRESSED_BYTES, "largest body once decompressed (bombs are dropped and counted)", positive
        ),
        "receive_hwm": Option(
            int, 10000, "messages ZeroMQ queues per socket while we do not read (then a PUB drops, a PUSH waits)", positive
        ),
        "silence_secs": Option(
            (int, float), DEFAULT_SILENCE_SECS, "reconnect an endpoint whose devices sent nothing, not even a heartbeat, this long", positive
        ),
        "max_devices": Option(int, 4096, "(endpoint, device) streams tracked at most; the least recently heard is forgotten", positive),
        "fqdn": Option(str, "", "the name a ping's `200 OK` reply carries (empty = this host's FQDN)"),
        "durability": STREAM_OPTIONS["durability"],
        "stop_drain_secs": STREAM_OPTIONS["stop_drain_secs"],
        "stop_quiet_secs": STREAM_OPTIONS["stop_quiet_secs"],
    }
    COUNTERS = {
        "messages": "data messages received (before duplicates are dropped)",
        "heartbeats": "device heartbeats received",
        "duplicates_dropped": "messages dropped as duplicates of a device's sequence",
        "pings": "pings answered on the ROUTER endpoint",
        "replies_accepted": "`202 Accepted` replies sent (each after its message was durable)",
        "replies_bad_request": "`400 Bad Request` replies sent",
        "store_failures": "messages whose batch the spool could not store",
        "reconnects": "SUB endpoints reconnected after silence",
    }

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[str]:
        if not (options["connect"] or options["listen_router"] or options["listen_pull"]):
            return ["connect, listen_router, listen_pull: set at least one (nothing to receive from)"]
        return []

    def __init__(self, name: str, options: dict[str, Any], context: Any) -> None:
        super().__init__(name, options, context)
        self.tracker = SequenceTracker(
            self.reactor, silence_secs=options["silence_secs"], max_keys=options["max_devices"]
        )
        self.drops = DroppedMessages(
            self.reactor, f"logjam source {name}", "logrouter_logjam_dropped_messages_total", {"source": name}
        )
        self.tag = TagTemplate(options["tag"])
        self._tags: dict[tuple[str, str, str], str] = {}
        self.batches = LogjamBatches(options["metadata_prefix"], options["time_fields"])
        self.fqdn = options["fqdn"] or socket.getfqdn()
        self.max_body_bytes = options["max_body_bytes"]
        self.max_decompressed_bytes = options["max_decompressed_bytes"]
        self.limits = (self.max_body_bytes, self.max_decompressed_bytes)
        subscriptions = tuple(s.encode("utf-8") for s in options["subscriptions"])
        if subscriptions and wire.HEARTBEAT not in subscriptions:
            subscriptions += (wire.HEARTBEAT,)
        self.specs: list[SocketSpec] = [SocketSpec(SUB, e, subscriptions or (b"",)) for e in options["connect"]]
        if options["listen_router"]:
            self.specs.append(SocketSpec(ROUTER, options["listen_router"]))
        if options["listen_pull"]:
            self.specs.append(SocketSpec(PULL, options["listen_pull"]))
        self.router_socket = next((i for i, s in enumerate(self.specs) if s.kind == ROUTER), -1)
        self.receiver: ZmqReceiver | None = None
        self.paused = False
        self.stopping = False
        self.pending: set[defer.Deferred] = set()
        self.last_received = 0.0
        self._liveness: task.LoopingCall | None = None

    # -- the source contract ----------------------------------------------------------------

    def start(self) -> defer.Deferred:
        self.receiver = ZmqReceiver(
            self.reactor,
            self.specs,
            self.decode_frames,
            self.received,
            name=self.name,
            finish=self.read_bodies,
            receive_hwm=self.options["receive_hwm"],
            # a frame bigger than any body we take is cut off by ZeroMQ before it is buffered
            max_message_bytes=max(self.max_body_bytes, 4096) + 4096,
        )
        if self.paused:
            self.receiver.pause()

        def started(bound: list[str]) -> list[str]:
            for spec, endpoint in zip(self.specs, bound):
                self.log.info(
                    "logjam source {name}: {kind} socket {how} {endpoint}",
                    name=self.name,
                    kind=spec.kind.upper(),
                    how="connected to" if spec.kind == SUB else "bound to",
                    endpoint=endpoint,
                )
            if any(spec.kind == SUB for spec in self.specs):
                self._liveness = task.LoopingCall(self.check_liveness)
                self._liveness.clock = self.reactor
                self._liveness.start(LIVENESS_SECS, now=False)
            return bound

        return self.receiver.start().addCallback(started)

    @property
    def bound(self) -> list[str]:
        """The endpoints as bound or connected, in socket order (tests read the ports)."""
        return list(self.receiver.bound) if self.receiver is not None else [s.endpoint for s in self.specs]

    def pause_reading(self) -> None:
        self.paused = True
        if self.receiver is not None:
            self.receiver.pause()

    def resume_reading(self) -> None:
        self.paused = False
        if self.receiver is not None and not self.stopping:
            for spec in self.specs:
                if spec.kind == SUB:
                    # Silence while we did not read was ours, not the devices': their
                    # silence clocks start again now.
                    self.tracker.reconnecting(spec.endpoint)
            self.receiver.resume()

    def stop(self) -> defer.Deferred:
        """Read on until the sockets are quiet (bounded), let stored batches get their
        replies, then close the sockets."""
        if self.receiver is None:
            return defer.succeed(None)
        self.stopping = True
        if self._liveness is not None and self._liveness.running:
            self._liveness.stop()
        done: defer.Deferred = defer.Deferred()
        deadline = self.reactor.seconds() + self._stop_drain_secs()
        quiet = float(self.options["stop_quiet_secs"])
        self.last_received = max(self.last_received, self.reactor.seconds())

        def check() -> None:
            now = self.reactor.seconds()
            if self.paused or now >= deadline or now - self.last_received >= quiet:
                self.receiver.pause()
                handed_over()
            else:
                self.reactor.callLater(min(_STOP_POLL_SECS, quiet), check)

        def handed_over() -> None:
            # Chunks the thread handed over before the pause are still on their way to
            # the reactor: they are stored (and replied to) like the rest, not cut off.
            if self.receiver.handed == 0 or self.reactor.seconds() >= deadline + 1.0:
                done.callback(None)
            else:
                self.reactor.callLater(0.01, handed_over)

        check()
        done.addCallback(lambda _: defer.DeferredList(list(self.pending), consumeErrors=True))
        done.addCallback(lambda _: self.receiver.stop())
        return done

    def _stop_drain_secs(self) -> float:
        limit = float(self.options["stop_drain_secs"])
        config = getattr(self.router, "config", None)
        shutdown = getattr(config, "router", {}).get("shutdown_timeout_secs", 0) if config is not None else 0
        if shutdown:
            limit = min(limit, shutdown * 0.5)
        return limit

    def samples(self) -> Iterator[Sample]:
        yield from super().samples()
        yield from self.drops.samples()
        yield from self.tracker.samples(self.name)

    # -- in the receiver's thread -----------------------------------------------------------

    def decode(self, kind: str, frames: list[bytes]) -> Request:
        """Decode one message's frames (the ROUTER routing id already taken off), its body
        read too: what the receiver thread's ``decode_frames`` and ``read_bodies`` do to
        a chunk, for one message. Pure, as everything in the receiver thread."""
        request = self.decode_frames(kind, frames)
        if request.decoded.__class__ is wire.UndecodedMessage:
            request.decoded = self.batches.read_many([request.decoded], int(self.reactor.seconds() * NANOS))[0]
        return request

    def decode_frames(self, kind: str, frames: list[bytes]) -> Request:
        """One message's frames decoded, a data message's body left to ``read_bodies``
        (an ``UndecodedMessage``) where the extension reads bodies."""
        limits = self.limits
        if kind == ROUTER and frames and frames[0] == b"":
            frames = frames[1:]
            first = frames[0] if frames else b""
            if first == wire.PING:
                valid = len(frames) == 4
                if valid:
                    try:
                        wire.decode_meta(frames[3])
                    except wire.LogjamDecodeError:
                        valid = False
                return Request(Ping(valid), first)
        else:
            first = None
            if kind == PULL and len(frames) == 3:
                frames = _legacy_frames(frames, int(self.reactor.seconds() * 1000))
                limits = (self.max_body_bytes, self.max_body_bytes)
        try:
            decoded, size = wire.decode_message_sized(frames, *limits, undecoded=self.batches.native)
        except wire.LogjamDecodeError as e:
            return Request(detached(e), first)  # kept in the chunk: no traceback tying the receiver's frames to it
        return Request(decoded, first, size)

    def read_bodies(self, chunk: list[Received]) -> list[Received]:
        """The receiver's ``finish``: the bodies ``decode_frames`` left undecoded in
        ``chunk`` read in one native call (``LogjamBatches.read_many``)."""
        undecoded = wire.UndecodedMessage
        requests = [
            r for r in (item.decoded for item in chunk) if r.__class__ is Request and r.decoded.__class__ is undecoded
        ]
        if requests:
            read = self.batches.read_many([r.decoded for r in requests], int(self.reactor.seconds() * NANOS))
            for request, decoded in zip(requests, read):
                request.decoded = decoded
        return chunk

    # -- on the reactor -------------------------------------------------------------------

    def received(self, chunk: list[Received]) -> None:
        """A chunk of decoded messages from the receiver: judge, batch and store them."""
        receiver = self.receiver
        try:
            self._take(chunk)
        finally:
            receiver.done()

    def _take(self, chunk: list[Received]) -> None:
        self.last_received = self.reactor.seconds()
        now_ns = int(self.last_received * NANOS)
        # per tag: the messages, the reply each owes (None: none) and its size
        groups: dict[str, tuple[list[Any], list[list[bytes] | None], list[int]]] = {}
        specs = self.specs
        tracker = self.tracker
        for item in chunk:
            request = item.decoded
            decoded = request.decoded if request.__class__ is Request else request
            spec = specs[item.socket]
            kind = decoded.__class__
            if kind is ScannedMessage or kind is wire.LogjamMessage:
                self.messages += 1
                meta = decoded.meta
                if spec.kind == SUB and tracker.observe(spec.endpoint, meta.device, meta.sequence) is not Verdict.NEW:
                    self.duplicates_dropped += 1
                    continue
                tag = self._tag_of(decoded.app, decoded.env, decoded.topic)
                group = groups.get(tag)
                if group is None:
                    group = groups[tag] = ([], [], [])
                group[0].append(decoded)
                first = request.reply_first
                group[1].append(None if first is None else [item.identity, first, wire.ACCEPTED])
                group[2].append(request.size + MESSAGE_OVERHEAD_BYTES)
            elif kind is wire.Heartbeat:
                self.heartbeats += 1
                if spec.kind == SUB:
                    meta = decoded.meta
                    tracker.heartbeat(spec.endpoint, meta.device, meta.sequence, decoded.endpoint)
            elif kind is Ping:
                if decoded.valid:
                    self.pings += 1
                    self._reply(item, [wire.PING, wire.OK, self.fqdn.encode("ascii", "replace")])
                else:
                    self.drops.drop("ping", f"ping without valid meta-info on {spec.endpoint}")
                    self._bad_request(item, request.reply_first)
            else:
                self._dropped(item, spec, decoded)
                if request.__class__ is Request and request.reply_first is not None:
                    self._bad_request(item, request.reply_first)
        for tag, (messages, replies, sizes) in groups.items():
            for start, end in split_by_size(sizes, BATCH_BYTES):
                self._store(tag, messages[start:end], replies[start:end], now_ns)

    def _dropped(self, item: Received, spec: SocketSpec, error: Any) -> None:
        if isinstance(error, wire.LogjamDecodeError):
            self.drops.drop(error.kind, f"{error.reason} (from {spec.kind.upper()} {spec.endpoint})")
        else:  # a bug in decoding: still only this message's loss, but say what it was
            self.drops.drop("internal", f"{type(error).__name__}: {error} (from {spec.kind.upper()} {spec.endpoint})")

    def _store(self, tag: str, messages: list[Any], replies: list[list[bytes] | None], now_ns: int) -> defer.Deferred:
        """Store one batch of messages received ``now_ns``; its ROUTER replies (``None``:
        none owed) leave once it is durable. Fires when every message of it is stored or
        refused."""
        d = self.router.ingest(self.batches.batch(tag, messages, now_ns, self.name))
        self.pending.add(d)

        def durable(_: Any) -> None:
            for frames in replies:
                if frames is not None:
                    self.replies_accepted += 1
                    self._send_router(frames)

        def failed(failure: Any) -> Any:
            if failure.check(UnstorableBatch) and len(messages) > 1:
                # One message too large or unencodable must not cost the others: halves
                # until each part is stored or is that message alone.
                half = len(messages) // 2
                parts = [
                    self._store(tag, messages[:half], replies[:half], now_ns),
                    self._store(tag, messages[half:], replies[half:], now_ns),
                ]
                return defer.DeferredList(parts, consumeErrors=True)
            self.store_failures += len(messages)
            if failure.check(UnstorableBatch):
                self.log.warn(
                    "logjam source {name}: {count} message(s) tagged {tag} cannot be stored: {error}",
                    name=self.name, count=len(messages), tag=tag, error=failure.getErrorMessage(),
                )
                for frames in replies:
                    if frames is not None:
                        self.replies_bad_request += 1
                        self._send_router([frames[0], frames[1], wire.BAD_REQUEST])
            else:
                # The disk failed: no reply, as for a message never received; the agent's
                # own timeout says it was not accepted.
                self.log.failure("logjam source {name}: batch could not be stored", failure, name=self.name)
            return None

        d.addCallbacks(durable, failed)
        d.addBoth(lambda _: self.pending.discard(d))
        return d

    def _reply(self, item: Received, frames: list[bytes]) -> None:
        self._send_router([item.identity, *frames])

    def _bad_request(self, item: Received, first: bytes) -> None:
        self.replies_bad_request += 1
        self._reply(item, wire.encode_bad_request(first))

    def _send_router(self, frames: list[bytes]) -> None:
        if self.receiver is not None:
            self.receiver.send(self.router_socket, frames)

    def _tag_of(self, app: str, env: str, topic: str) -> str:
        key = (app, env, topic)
        tag = self._tags.get(key)
        if tag is None:
            if len(self._tags) >= 4096:
                self._tags.clear()
            tag = self._tags[key] = self.tag.render({"app": app, "env": env, "topic": topic})
        return tag

    # -- liveness ---------------------------------------------------------------------------

    def check_liveness(self) -> None:
        """Reconnect each SUB endpoint whose devices all went silent (the importer's rule)."""
        if self.receiver is None or self.paused:
            return  # silence we caused by not reading is not the device's
        for endpoint in self.tracker.silent_endpoints():
            for index, spec in enumerate(self.specs):
                if spec.kind == SUB and spec.endpoint == endpoint:
                    announced = sorted({s.announced for s in self.tracker.silent() if s.endpoint == endpoint and s.announced})
                    self.log.warn(
                        "logjam source {name}: nothing from {endpoint} for {secs:g}s (devices announced {announced}); reconnecting",
                        name=self.name, endpoint=endpoint, secs=self.tracker.silence_secs,
                        announced=", ".join(announced) or "nothing",
                    )
                    self.reconnects += 1
                    self.receiver.reconnect(index)
                    self.tracker.reconnecting(endpoint)

