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
- Bad input (a framing error, or a frame over ``max_frame_bytes``, ``max_event_bytes``,
  ``max_data_fields``, ``max_window_size``, ``max_decompressed_bytes``) closes the
  connection with a log line naming the limit. The events the same read brought before
  it are stored and acknowledged first; a bad ``C`` frame gives none of its events.

Events become ``(time_ns, record)``: the JSON object of a ``J`` frame (the key/value
strings of a ``D`` frame) with its fields intact, the time taken from ``@timestamp``
(RFC 3339) when it parses, else the time of arrival. The tag is the ``tag`` option, which
may refer to event fields (``"beats.${@metadata.beat}"``, see ``TagTemplate``).
"""

from __future__ import annotations

import calendar
import datetime
import re
from typing import Any, Callable

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, non_negative, positive
from logrouter.sources.acks import OrderedAcks
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.wire import lumberjack as wire

NANOS = 1_000_000_000


# -- event time --------------------------------------------------------------------------

_SECONDS_CACHE: dict[str, int | None] = {}
_SECONDS_CACHE_LIMIT = 4096
_FRACTION_SCALE = [10 ** (9 - n) for n in range(10)]


def _whole_seconds(prefix: str) -> int | None:
    """``YYYY-MM-DDTHH:MM:SS`` (UTC) as seconds since the epoch, cached (events of one
    window mostly share a few seconds)."""
    try:
        return _SECONDS_CACHE[prefix]
    except KeyError:
        pass
    seconds = None
    if prefix[4] == "-" and prefix[7] == "-" and prefix[10] in "Tt " and prefix[13] == ":" and prefix[16] == ":":
        try:
            seconds = calendar.timegm(datetime.datetime.fromisoformat(prefix.replace("t", "T")).timetuple())
        except ValueError:
            seconds = None
    if len(_SECONDS_CACHE) >= _SECONDS_CACHE_LIMIT:
        _SECONDS_CACHE.clear()
    _SECONDS_CACHE[prefix] = seconds
    return seconds


def _time_of(stamp: Any, now: int) -> int:
    """``@timestamp`` as ns since the epoch, or ``now`` when it is no RFC 3339 string."""
    if stamp.__class__ is str:
        t = timestamp_ns(stamp)
        if t is not None:
            return t
    return now


def timestamp_ns(text: str) -> int | None:
    """An RFC 3339 time (``2024-01-02T03:04:05.678Z``, any fraction up to nanoseconds,
    ``Z`` or ``±HH:MM``) as nanoseconds since the epoch; None when it does not parse.

    The common Beats form (UTC, ``Z``) takes a cached fast path; offsets go through
    ``datetime.fromisoformat`` (a time without an offset is taken as UTC).
    """
    if len(text) >= 20 and text[-1] in "Zz":
        seconds = _whole_seconds(text[:19])
        if seconds is None:
            return None
        fraction = text[19:-1]
        if not fraction:
            return seconds * NANOS
        digits = fraction[1:10]
        if fraction[0] == "." and digits.isascii() and digits.isdigit() and fraction[1:].isdigit():
            return seconds * NANOS + int(digits) * _FRACTION_SCALE[len(digits)]
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    whole = calendar.timegm(parsed.utctimetuple())
    return whole * NANOS + parsed.microsecond * 1000


# -- tags --------------------------------------------------------------------------------

_FIELD = re.compile(r"\$\{([^{}]*)\}")


def _scalar_text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


class TagTemplate:
    """A ``tag`` option: literal text with ``${field}`` references to event fields.

    ``${@metadata.beat}`` walks nested objects (``record["@metadata"]["beat"]``); a
    top-level key that itself contains the dots is found first. ``${field:-text}`` gives
    ``text`` when the field is missing, null, an object or an array; without a default
    that part is empty. Scalars are used as text (``true``/``false`` for booleans). A
    ``$`` not followed by ``{`` is literal.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self.parts: list[str | tuple[str, tuple[str, ...], str]] = []
        pos = 0
        for m in _FIELD.finditer(template):
            if m.start() > pos:
                self.parts.append(template[pos : m.start()])
            name, _, default = m.group(1).partition(":-")
            name = name.strip()
            if not name or any(not key for key in name.split(".")):
                raise ValueError(f"bad field reference {m.group(0)!r} in tag {template!r}")
            self.parts.append((name, tuple(name.split(".")), default))
            pos = m.end()
        rest = template[pos:]
        if "${" in rest:
            raise ValueError(f"unterminated '${{' in tag {template!r}")
        if rest:
            self.parts.append(rest)
        self.static: str | None = template if all(isinstance(p, str) for p in self.parts) else None
        self.render = self._compile()

    def _compile(self) -> Callable[[dict[str, Any]], str]:
        """A renderer specialised for this template (it runs once per event)."""
        if self.static is not None:
            static = self.static
            return lambda record: static
        pieces: list[Any] = [p if isinstance(p, str) else _field_getter(*p) for p in self.parts]
        if len(pieces) <= 3 and sum(not isinstance(p, str) for p in pieces) == 1:
            # The common shape, prefix.${field}.suffix: two concatenations.
            i = next(i for i, p in enumerate(pieces) if not isinstance(p, str))
            prefix, get, suffix = "".join(pieces[:i]), pieces[i], "".join(pieces[i + 1 :])
            return lambda record: prefix + get(record) + suffix

        def render(record: dict[str, Any]) -> str:
            return "".join([p if p.__class__ is str else p(record) for p in pieces])

        return render


def _field_getter(name: str, keys: tuple[str, ...], default: str) -> Callable[[dict[str, Any]], str]:
    if len(keys) == 1:

        def get_top(record: dict[str, Any]) -> str:
            value = record.get(name)
            if value.__class__ is str:
                return value
            text = _scalar_text(value)
            return default if text is None else text

        return get_top

    def get_path(record: dict[str, Any]) -> str:
        value = record.get(name)  # a top-level key with the dots in it wins
        if value is None:
            value = record
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
                if value is None:
                    break
        if value.__class__ is str:
            return value
        text = _scalar_text(value)
        return default if text is None else text

    return get_path


def check_tag(value: str) -> None:
    TagTemplate(value)


# -- the protocol ------------------------------------------------------------------------


class LumberjackProtocol(StreamProtocol):
    def __init__(self, source: "LumberjackSource") -> None:
        super().__init__(source)
        # Steps in arrival order, keyed by window serial, valued by the highest seq they cover.
        self.acks = OrderedAcks(
            source.reactor,
            self._write_acks,
            self._encode_ack,
            source.options["keepalive_secs"],
            self._encode_keepalive,
            also_waiting=self.stalled_by_us,
        )

    def make_decoder(self) -> wire.LumberjackDecoder:
        options = self.source.options
        return wire.LumberjackDecoder(
            max_window_size=options["max_window_size"],
            max_frame_bytes=options["max_frame_bytes"],
            max_decompressed_bytes=options["max_decompressed_bytes"],
            max_event_bytes=options["max_event_bytes"],
            max_data_fields=options["max_data_fields"],
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
        if message.invalid:
            source.invalid_events += message.invalid
            self.log.warn(
                "lumberjack {peer}: skipped {count} invalid event(s) in window {window} ({reason})",
                peer=self.peer,
                count=message.invalid,
                window=message.window,
                reason=message.invalid_reason,
            )
        batches = source.batches(message.records, int(source.reactor.seconds() * NANOS))
        step = self.acks.add(message.window, message.ack_seq, len(batches))
        for batch in batches:
            self.submit(batch, self.acks.on_durable(step))

    # -- acknowledging (logrouter.sources.acks) ------------------------------------------

    def _encode_ack(self, window: int, value: int) -> bytes:
        return wire.encode_ack(value, self.decoder.version or 2)

    def _encode_keepalive(self, window: Any, acked: int) -> bytes:
        # Logstash writes '2' here even to v1 peers; the Node v1 client rejects that,
        # so the connection's own version byte is used (protocols/lumberjack.md 9).
        return wire.encode_ack(0, self.decoder.version or 2)

    def _write_acks(self, data: bytes) -> None:
        self.send(data)
        self.resetTimeout()  # the client's turn starts now: idleness counts from here

    def stalled_by_us(self) -> bool:
        """Reading is paused (backpressure) while the client is in the middle of a window.

        Beats then waits for an ack we cannot give yet; ACK 0 keeps it from timing out
        after 30 s and resending. Only for v2: the v1 Node client reads ACK 0 as a reset.
        """
        return self.source.paused and self.decoder.version == 2 and self.decoder.window_incomplete

    def timeoutConnection(self) -> None:
        if self.acks.waiting() and not self.closing:
            # The client is silent because it waits for our acks: not idle.
            self.setTimeout(self.source.options["idle_timeout_secs"])
            return
        super().timeoutConnection()

    def store_failed(self, failure: Any) -> None:
        self.acks.close()
        super().store_failed(failure)  # logged, counted, aborted at once: the client resends

    def close_now(self) -> None:
        self.acks.close()
        super().close_now()

    def connectionLost(self, reason: Any = None) -> None:
        self.acks.close()
        super().connectionLost(reason)


# -- the source --------------------------------------------------------------------------


@registry.source("lumberjack")
class LumberjackSource(StreamSource):
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
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.invalid_events = 0
        self.tag_template = TagTemplate(self.options["tag"])
        self.batches = self._batch_builder()

    def pause_reading(self) -> None:
        super().pause_reading()
        for connection in self.connections:
            if connection.stalled_by_us():  # type: ignore[attr-defined]
                connection.acks.wait_began()  # type: ignore[attr-defined]

    def _batch_builder(self) -> Callable[[list[dict[str, Any]], int], list[Batch]]:
        """The per-event work, specialised once for this source's options."""
        static_tag = self.tag_template.static
        render = self.tag_template.render
        drop_metadata = not self.options["keep_metadata"]
        whole_seconds = _SECONDS_CACHE.get

        def timed(records: list[dict[str, Any]], now: int) -> list[tuple[int, dict[str, Any]]]:
            events = []
            append = events.append
            last: Any = None
            t = now
            for r in records:
                stamp = r.get("@timestamp")
                if stamp != last:  # consecutive events mostly share their stamp: parse once
                    last = stamp
                    t = -1
                    # Inline fast path for Beats' own form, 2024-01-02T03:04:05.678Z.
                    if stamp.__class__ is str and len(stamp) == 24 and stamp[19] == "." and stamp[23] == "Z":
                        seconds = whole_seconds(stamp[:19])
                        millis = stamp[20:23]
                        if seconds is not None and millis.isdigit():
                            t = seconds * NANOS + int(millis) * 1_000_000
                    if t < 0:
                        t = _time_of(stamp, now)
                append((t, r))
            return events

        def batches(records: list[dict[str, Any]], now: int) -> list[Batch]:
            if not records:
                return []
            if static_tag is not None:
                if drop_metadata:
                    for r in records:
                        r.pop("@metadata", None)
                return [Batch(static_tag, timed(records, now))]
            by_tag: dict[str, list[dict[str, Any]]] = {}
            for r in records:
                tag = render(r)
                group = by_tag.get(tag)
                if group is None:
                    by_tag[tag] = [r]
                else:
                    group.append(r)
            if drop_metadata:
                for r in records:
                    r.pop("@metadata", None)
            return [Batch(tag, timed(group, now)) for tag, group in by_tag.items()]

        return batches
