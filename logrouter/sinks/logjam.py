"""The ``logjam`` sink: republish routed events on a ZeroMQ PUB socket as a logjam device does.

It is the publishing half of a logjam device (``docs/protocols/logjam.md`` sections 5 and 7),
so logjam importers, and logrouter's own ``logjam`` source, can subscribe to logrouter.
The frames themselves are ``logrouter.wire.logjam``'s; this module owns what goes into
them, the numbering, the heartbeats, the socket and the cursor.

**Messages.** Every event becomes one 4-frame message: app-env, topic, body, meta-info.
``app``, ``env`` and ``topic`` come from the record's ``<metadata_prefix>app``, ``…env``
and ``…topic`` fields when all three are strings (default prefix ``logjam_``: what the
``logjam`` source adds, with ``…device`` and ``…sequence``); otherwise from the ``app`` /
``env`` / ``topic`` templates (``${field}``, ``${field:-default}``) rendered over the
record. The body is the record without those five fields (the record itself is never
changed), as compact UTF-8 JSON with values JSON has no form
for spelled as in the lake's ``_extra`` column (``logrouter.lake.extra``), compressed as
``compression`` says. created_ms is the event time in milliseconds. An event whose
app-env the device would refuse (bytes outside 32..127, a ``-`` in env, an empty app or
env) or whose topic is not ASCII is not sent: it is counted (``invalid_events``) and goes
to the error path; the rest of its batch is sent.

**Numbering.** The meta-info carries ``device_number`` and the sink's own sequence
number, which starts at 1 after every start and counts every message published,
heartbeats included (u64, wrapping past 0 to 1), as the device numbers them. Numbers are
taken on the reactor thread at the moment of sending, so they follow publishing order
even when bodies were encoded in a thread. A message ZeroMQ refuses at once
(``zmq.Again``; PUB does not do that, it drops silently for a subscriber whose queue is
full) is counted in ``dropped_messages`` and still uses its number, so importers see the
loss as a gap.

**Heartbeats.** Every ``heartbeat_secs`` (the first one ``heartbeat_secs`` after start,
as the device does) a ``heartbeat`` message announces ``announce`` (default
``tcp://<fqdn>:<bound port>``), the endpoint importers reconnect to when they have not
heard from this device for a while.

**Delivery and the cursor.** PUB/SUB has no acknowledgements: a spool record counts as
done once its messages are handed to ZeroMQ, and the cursor moves past it then. So each
publish reaches each subscriber at most once (not at all for a subscriber that was not
connected yet, was too slow, or lost its connection), and a crash resends everything
after the cursor last saved (about once a second): across crashes delivery is at least
once, with duplicates, and importers see our sequence restart at 1. A failure of the
socket itself drops what is held and replays from the cursor after the backoff.

**Threads.** Only the reactor thread touches the socket. Spool records of
``INLINE_EVENTS`` events or more have their bodies encoded (JSON, compression) in a
worker thread through ``run_blocking``; smaller ones are encoded at once; whatever the
way, records are published strictly in spool order. The socket has its own ZeroMQ
context, so that ``stop`` can wait, in a thread, up to ``linger_secs`` for ZeroMQ to
flush what is queued (terminating a shared context would close other components'
sockets). The state file (``{"cursor": …}``) is saved in a thread at most about once a
second and on stop.
"""

from __future__ import annotations

import collections
import socket
from typing import Any, Iterator

from twisted.internet import defer
from twisted.python.failure import Failure

from logrouter import registry
from logrouter.batch import Batch, Event
from logrouter.config.options import REQUIRED, Option, non_negative, one_of, positive
from logrouter.config.zmq_endpoints import bind_option, check_zmq_endpoint
from logrouter.lake.extra import encode_extra
from logrouter.lazy_import import lazy
from logrouter.sinks.base import SINK_OPTIONS
from logrouter.sinks.forwarding import ForwardingSink
from logrouter.sources.events import TagTemplate
from logrouter.wire import logjam as wire
from logrouter.wire.logjam import METADATA_NAMES

zmq = lazy("zmq")  # loaded when the sink binds: the config check imports this module everywhere

INLINE_EVENTS = 64  # records this small are encoded on the reactor thread (a thread hop costs more)
MAX_DEVICE = 0xFFFFFFFF
SEQUENCE_MASK = (1 << 64) - 1
MAX_CREATED_MS = SEQUENCE_MASK
SENT, DROPPED, BROKEN = 1, 0, -1  # what _send did; SENT and DROPPED add up as counts
COMPRESSION_IDS = {name: number for number, name in wire.COMPRESSION_NAMES.items()}

# A message ready but for its meta-info: (app-env, topic, compressed body, created_ms).
Prepared = tuple[bytes, bytes, bytes, int]
# An event that cannot be sent: (tag, record, reason).
Invalid = tuple[str, dict[str, Any], str]


class LogjamSinkError(Exception):
    """The PUB socket failed (anything but a full queue)."""


# -- config ------------------------------------------------------------------------------


def _check_device(value: int) -> None:
    if not 0 <= value <= MAX_DEVICE:
        raise ValueError(f"must be from 0 to {MAX_DEVICE}, got {value!r}")


def _name_problem(text: str, what: str) -> str | None:
    """Why ``text`` cannot be the app or env of an app-env frame, or ``None``."""
    if not text:
        return f"{what} is empty"
    if not all(32 <= ord(c) <= 127 for c in text):
        return f"{what} {text!r} has characters outside ASCII 32..127"
    if what == "env" and "-" in text:
        return f"env {text!r} contains '-' (the app-env name is split at its last '-')"
    return None


def _template_check(what: str) -> Any:
    def check(value: str) -> None:
        template = TagTemplate(value)  # as check_tag: raises ValueError naming the bad reference
        if template.static is None:
            return  # checked per event
        if what == "topic":
            if not value.isascii():
                raise ValueError(f"must be ASCII, got {value!r}")
            return
        problem = _name_problem(value, what)
        if problem is not None:
            raise ValueError(problem)

    return check


def _check_announce(value: str) -> None:
    if not value:
        return
    if not value.isascii():
        raise ValueError(f"must be ASCII, got {value!r}")
    check_zmq_endpoint(value, bind=False)


# -- encoding (pure: runs in a worker thread for big records) ----------------------------


def stream_frame(app: str, env: str) -> bytes | str:
    """The app-env frame, or the reason the device would refuse it."""
    problem = _name_problem(app, "app") or _name_problem(env, "env")
    if problem is not None:
        return problem
    return f"{app}-{env}".encode("ascii")


def prepare(
    groups: list[tuple[str, list[Event]]],
    prefix: str,
    app: TagTemplate,
    env: TagTemplate,
    topic: TagTemplate,
    compression: int,
) -> tuple[list[Prepared], list[Invalid]]:
    """The messages of ``groups`` without their meta-info, and the events that cannot be sent."""
    out: list[Prepared] = []
    invalid: list[Invalid] = []
    append = out.append
    streams: dict[tuple[str, str], bytes | str] = {}
    topics: dict[str, bytes | None] = {}
    compress = wire.compress_body
    render_app, render_env, render_topic = app.render, env.render, topic.render
    app_key, env_key, topic_key = prefix + "app", prefix + "env", prefix + "topic"
    metadata_keys = frozenset(prefix + name for name in METADATA_NAMES) if prefix else frozenset()
    for tag, events in groups:
        for time_ns, record in events:
            a = record.get(app_key) if prefix else None
            e = record.get(env_key) if prefix else None
            t = record.get(topic_key) if prefix else None
            if a.__class__ is not str or e.__class__ is not str or t.__class__ is not str:
                a, e, t = render_app(record), render_env(record), render_topic(record)
            stream = streams.get((a, e))
            if stream is None:
                stream = streams[(a, e)] = stream_frame(a, e)
            if stream.__class__ is str:
                invalid.append((tag, record, f"not sent: {stream}"))
                continue
            topic_frame = topics.get(t, b"")
            if topic_frame == b"":
                topic_frame = topics[t] = t.encode("ascii") if t.isascii() else None
            if topic_frame is None:
                invalid.append((tag, record, f"not sent: topic {t!r} is not ASCII"))
                continue
            body = {k: v for k, v in record.items() if k not in metadata_keys} if prefix and app_key in record else record
            try:
                data = encode_extra(body).encode("utf-8")
            except Exception as exc:  # noqa: BLE001 - one odd value costs only its event
                invalid.append((tag, record, f"not sent: body cannot be encoded: {type(exc).__name__}: {exc}"))
                continue
            created_ms = time_ns // 1_000_000
            if created_ms < 0:
                created_ms = 0
            elif created_ms > MAX_CREATED_MS:
                created_ms = MAX_CREATED_MS
            append((stream, topic_frame, compress(data, compression), created_ms))  # type: ignore[arg-type]
    return out, invalid


# -- bookkeeping -------------------------------------------------------------------------


class _Record:
    """The events of one spool record, from handed over to published."""

    __slots__ = ("groups", "count", "end", "size", "epoch", "done", "messages", "invalid", "deferred")

    def __init__(self, groups: list[tuple[str, list[Event]]], count: int, end: int, size: int, epoch: int) -> None:
        self.groups = groups
        self.count = count
        self.end = end
        self.size = size
        self.epoch = epoch
        self.done = False
        self.messages: list[Prepared] = []
        self.invalid: list[Invalid] = []
        self.deferred: defer.Deferred | None = None  # while encoded in a thread


# -- the sink ----------------------------------------------------------------------------


@registry.sink("logjam")
class LogjamSink(ForwardingSink):
    # Its PUB socket binds, and importers track one device's sequence numbers.
    SINGLE_PROCESS = "a logjam sink is one device with one bound PUB socket"
    COUNTERS = {
        "messages_sent": "data messages handed to the PUB socket",
        "heartbeats_sent": "heartbeat messages handed to the PUB socket",
        "invalid_events": "events not sent: app-env or topic not acceptable to logjam, or a body that cannot be encoded",
        "dropped_messages": "messages the PUB socket refused at once (their sequence numbers are used: importers see a gap)",
    }
    OPTIONS = {
        "bind": bind_option(
            REQUIRED, "ZeroMQ endpoint the PUB socket binds, e.g. `tcp://*:9606` (logjam's port); `tcp://127.0.0.1:*` = any free port"
        ),
        "device_number": Option(
            int,
            doc="device number in every message's meta-info (0–4294967295); must be unique among the devices an importer "
            "reads; 0 turns off importers' gap checks for this device",
            check=_check_device,
        ),
        "compression": Option(
            str, "none", 'body compression: `"none"`, `"zlib"`, `"snappy"` or `"lz4"`', one_of(*COMPRESSION_IDS)
        ),
        "heartbeat_secs": Option((int, float), 5, "interval of the heartbeat messages (the device's is 5 s)", positive),
        "announce": Option(
            str,
            "",
            "endpoint the heartbeats announce, where importers reconnect; `\"\"` = `tcp://<this host's FQDN>:<bound port>`",
            _check_announce,
        ),
        "metadata_prefix": Option(
            str,
            "logjam_",
            "records with string `<prefix>app`, `<prefix>env` and `<prefix>topic` fields (what the `logjam` source adds) are "
            'published under those; the five `<prefix>` fields are left out of the body; `""` = always use the templates',
        ),
        "app": Option(str, "logrouter", "app of records without metadata; `${field}` / `${field:-default}` refer to record fields", _template_check("app")),
        "env": Option(str, "production", "env of records without metadata (no `-`); `${field}` as in `app`", _template_check("env")),
        "topic": Option(str, "logs", "topic of records without metadata; `${field}` as in `app`", _template_check("topic")),
        "send_hwm": Option(int, 10000, "messages queued per subscriber (ZeroMQ SNDHWM); beyond it a slow subscriber misses messages", positive),
        "linger_secs": Option(
            (int, float), 1.0, "on stop, wait this long for ZeroMQ to send what is queued", non_negative
        ),
        **SINK_OPTIONS,
    }

    ERROR = LogjamSinkError

    def __init__(self, name: str, options: dict[str, Any], errors: Any, reactor: Any) -> None:
        super().__init__(name, options, errors, reactor)
        self.prefix = options["metadata_prefix"]
        self.device = int(options["device_number"])
        self.compression = COMPRESSION_IDS[options["compression"]]
        self.templates = (TagTemplate(options["app"]), TagTemplate(options["env"]), TagTemplate(options["topic"]))
        self.context: zmq.Context | None = None
        self.socket: zmq.Socket | None = None
        self.bound_endpoint = ""
        self.announce = ""
        self.sequence = 0  # the last number used
        self.records: collections.deque[_Record] = collections.deque()
        self.unsent: list[tuple[str, list[Event]]] = []  # written, not yet advanced past
        self.unsent_events = 0
        self._bytes_since_mark = 0
        self._feeding = False  # inside advance(): the router is handing over, no on_progress
        # counters
        self.messages_sent = 0
        self.heartbeats_sent = 0
        self.invalid_events = 0
        self.dropped_messages = 0

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """SinkBase's samples, plus the last sequence number used."""
        yield from super().samples()
        yield "logrouter_sink_logjam_sequence", "gauge", self.labels(), self.sequence

    # -- lifecycle (the steps ForwardingSink leaves to the protocol) ----------------------

    def _open(self) -> None:
        self._bind()

    def _bind(self) -> None:
        endpoint = self.options["bind"]
        context = zmq.Context(io_threads=1)
        sock = context.socket(zmq.PUB)
        try:
            sock.setsockopt(zmq.SNDHWM, int(self.options["send_hwm"]))
            sock.setsockopt(zmq.LINGER, int(float(self.options["linger_secs"]) * 1000))
            sock.bind(endpoint)
        except zmq.ZMQError as e:
            sock.close(linger=0)
            context.term()
            raise LogjamSinkError(f"logjam sink {self.name}: cannot bind {endpoint}: {e}") from None
        self.context, self.socket = context, sock
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        self.bound_endpoint = last.decode("utf-8", "replace") if isinstance(last, bytes) else str(last)

    def _load_state(self) -> tuple[int, str]:
        """Blocking: the saved cursor and the announced endpoint (an FQDN lookup)."""
        cursor = super()._load_state()
        return cursor, self.options["announce"] or default_announce(self.bound_endpoint, socket.getfqdn())

    def _resume(self, loaded: tuple[int, str]) -> int:
        cursor, self.announce = loaded
        self.sequence = 0
        return cursor

    def _start_failed(self, failure: Failure) -> Failure:
        context = self._close(linger=0)
        if context is not None:
            context.term()  # nothing was sent: returns at once
        return failure

    def _heartbeat_secs(self) -> float:
        return float(self.options["heartbeat_secs"])

    def _log_started(self, cursor: int) -> None:
        self.log.info(
            "logjam sink {name}: publishing on {endpoint} as device {device} (compression {compression}, "
            "heartbeats every {heartbeat:g}s announcing {announce}); resuming from spool position {cursor}",
            name=self.name,
            endpoint=self.bound_endpoint,
            device=self.device,
            compression=self.options["compression"],
            heartbeat=float(self.options["heartbeat_secs"]),
            announce=self.announce,
            cursor=cursor,
        )

    def _drain_timeout(self) -> None:
        return None  # records still being encoded are published before the socket closes

    def _drained(self) -> bool:
        return not any(r.deferred is not None and not r.done for r in self.records)

    def _close_output(self, saved: defer.Deferred) -> defer.Deferred:
        context = self._close()
        if context is not None:
            # term() returns once ZeroMQ sent what was queued, or linger_secs passed.
            saved.addBoth(lambda _: self.run_blocking(context.term))
        return saved

    def _close(self, linger: int | None = None) -> zmq.Context | None:
        """Close the socket (with the LINGER set at bind unless told); the context is the caller's to term."""
        sock, self.socket = self.socket, None
        context, self.context = self.context, None
        if sock is not None:
            sock.close(linger=linger)
        return context

    # -- fed by the router ---------------------------------------------------------------

    def write(self, batch: Batch, position: int, size: int) -> None:
        self._hold(batch, size)

    def advance(self, end: int) -> None:
        if not self.accepting:
            return
        record = _Record(self.unsent, self.unsent_events, end, self._bytes_since_mark, self.epoch)
        self.unsent, self.unsent_events, self._bytes_since_mark = [], 0, 0
        self.records.append(record)
        self._feeding = True
        try:
            if record.count == 0:
                record.done = True
            elif record.count < INLINE_EVENTS:
                self._prepared(prepare(*self._prepare_args(record)), record)
            else:
                d = self.run_blocking(prepare, *self._prepare_args(record))
                record.deferred = d
                d.addCallbacks(self._prepared, self._prepare_failed, callbackArgs=(record,), errbackArgs=(record,))
            self._publish()
        finally:
            self._feeding = False

    def _prepare_args(self, record: _Record) -> tuple[Any, ...]:
        app, env, topic = self.templates
        return (record.groups, self.prefix, app, env, topic, self.compression)

    def _prepared(self, result: tuple[list[Prepared], list[Invalid]], record: _Record) -> None:
        record.messages, record.invalid = result
        record.groups = []
        record.done = True
        if record.epoch == self.epoch and not self._feeding:
            self._publish()
        self._check_drained()

    def _prepare_failed(self, failure: Failure, record: _Record) -> None:
        # A bug, not a bad event (prepare() catches those): retrying would fail the same
        # way, so the record's events go to the error path and the cursor moves on.
        self.log.failure("logjam sink {name}: encoding a record failed", failure, name=self.name)
        reason = f"not sent: encoding failed: {failure.getErrorMessage()}"
        record.invalid = [(tag, rec, reason) for tag, events in record.groups for _, rec in events]
        record.groups = []
        record.done = True
        if record.epoch == self.epoch and not self._feeding:
            self._publish()
        self._check_drained()

    def _drop(self) -> None:
        self.records.clear()
        self.unsent = []
        self.unsent_events = 0
        self._bytes_since_mark = 0
        self.queued_bytes = 0

    # -- sending (reactor thread only) ---------------------------------------------------

    def _next_sequence(self) -> int:
        self.sequence = (self.sequence + 1) & SEQUENCE_MASK or 1
        return self.sequence

    def _send(self, frames: list[bytes]) -> int:
        """Hand one message to ZeroMQ: ``SENT``, ``DROPPED`` (queue full) or ``BROKEN`` (the sink is failing then)."""
        sock = self.socket
        if sock is None:
            return BROKEN
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped_messages += 1
            return DROPPED
        except zmq.ZMQError as e:
            self._broken(f"sending on {self.bound_endpoint} failed: {e}")
            return BROKEN
        return SENT

    def _publish(self) -> None:
        """Publish every record at the head of the queue that is ready, in order; move the cursor."""
        if self.failing or self.socket is None:
            return
        records = self.records
        moved = sent = False
        device, compression, meta_pack = self.device, self.compression, wire.encode_meta
        while records and records[0].done:
            record = records.popleft()
            if record.epoch != self.epoch:
                continue
            for tag, rec, reason in record.invalid:
                self.invalid_events += 1
                self.errors(self.name, tag, rec, reason)
            for stream, topic, body, created_ms in record.messages:
                meta = wire.Meta(compression, device, created_ms, self._next_sequence())
                outcome = self._send([stream, topic, body, meta_pack(meta)])
                if outcome == BROKEN:
                    return
                self.messages_sent += outcome
                sent = True
            record.messages = []
            self.queued_bytes = max(0, self.queued_bytes - record.size)
            if record.end > self.cursor:
                self.cursor = record.end
            moved = True
        if sent:
            self.succeeded()
        if moved and not self._feeding:
            self._notify()  # a record encoded in a thread: the router may feed more

    def _heartbeat(self) -> None:
        if self.socket is None or self.stopped:
            return
        now_ms = max(0, int(self.reactor.seconds() * 1000))
        frames = wire.encode_heartbeat(self.announce, self.device, self._next_sequence(), now_ms)
        outcome = self._send(frames)
        if outcome != BROKEN:
            self.heartbeats_sent += outcome


def default_announce(bound_endpoint: str, fqdn: str) -> str:
    """``tcp://<fqdn>:<bound port>`` for a TCP socket; other endpoints as bound."""
    if not bound_endpoint.startswith("tcp://"):
        return bound_endpoint
    port = bound_endpoint.rpartition(":")[2]
    host = fqdn if fqdn and fqdn.isascii() else bound_endpoint[len("tcp://") :].rpartition(":")[0]
    return f"tcp://{host}:{port}"
