"""The ``fluent_forward`` source: Fluentd's forward protocol (in_forward's server side).

Each decoded message becomes one batch. When the client asked for an ack (option
``chunk``), ``{"ack": chunk}`` is sent with the chunk's bytes exactly as received, and
only after the batch is durable in the spool.
"""

from __future__ import annotations

from typing import Any

from logrouter import registry
from logrouter.batch import Batch
from logrouter.config.endpoints import listen_option
from logrouter.config.options import Option, positive
from logrouter.sources.stream import StreamProtocol, StreamSource
from logrouter.wire import fluent_forward as wire


class ForwardProtocol(StreamProtocol):
    def make_decoder(self) -> wire.ForwardDecoder:
        return wire.ForwardDecoder(
            max_message_bytes=self.source.options["max_message_bytes"],
            max_decompressed_bytes=self.source.options["max_decompressed_bytes"],
        )

    def handle(self, message: Any) -> None:
        if isinstance(message, wire.Heartbeat):
            return
        if message.invalid:
            self.source.invalid_events += message.invalid
            self.log.warn(
                "fluent_forward {peer}: skipped {count} invalid event(s) in tag {tag}",
                peer=self.peer,
                count=message.invalid,
                tag=message.tag,
            )
        chunk = message.chunk
        on_durable = None if chunk is None else (lambda: self.send(wire.encode_ack(chunk, self.decoder.json_mode)))
        if not message.events:
            # Nothing to store (all invalid, or empty): fluentd still acks such a chunk.
            if on_durable is not None:
                on_durable()
            return
        self.submit(Batch(message.tag, message.events), on_durable, chunk)


@registry.source("fluent_forward")
class FluentForwardSource(StreamSource):
    protocol_class = ForwardProtocol
    OPTIONS = {
        **StreamSource.OPTIONS,
        "listen": listen_option("tcp:24224"),
        "max_message_bytes": Option(int, 64 << 20, "largest forward message accepted", positive),
        "max_decompressed_bytes": Option(int, 256 << 20, "largest inflated CompressedPackedForward payload", positive),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.invalid_events = 0
