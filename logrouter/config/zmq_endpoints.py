"""ZeroMQ endpoint strings in the config (``tcp://host:port``, ``ipc://path``).

ZeroMQ parses these itself only when a socket binds or connects, which is too late to
name the config key; so the shapes a logrouter ZeroMQ component accepts are checked here
at validation time: ``tcp://`` with a host (``*`` or an interface when binding, a name or
address when connecting, IPv6 in brackets) and a port 1..65535 (``*`` = any free port,
binding only), or ``ipc://`` with a path. ``inproc://`` is refused: no other process can
reach it.
"""

from __future__ import annotations

import re
from typing import Any

from logrouter.config.options import Option, Problems

_TCP = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>\*|\d+)$")


def check_zmq_endpoint(text: str, bind: bool = False) -> None:
    """Raise ``ValueError`` (completing "<path>: …") when ``text`` is no usable endpoint."""
    if text.startswith("ipc://"):
        if len(text) == len("ipc://"):
            raise ValueError(f"bad ZeroMQ endpoint {text!r}: ipc:// needs a path")
        return
    m = _TCP.match(text)
    if m is None:
        raise ValueError(
            f"bad ZeroMQ endpoint {text!r}: expected tcp://host:port or ipc://path"
        )
    host, port = m.group("host"), m.group("port")
    if port == "*":
        if not bind:
            raise ValueError(f"bad ZeroMQ endpoint {text!r}: a connect endpoint needs a port number, not '*'")
        return
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"bad ZeroMQ endpoint {text!r}: port {port} is outside 1..65535")
    if host == "*" and not bind:
        raise ValueError(f"bad ZeroMQ endpoint {text!r}: a connect endpoint needs a host, not '*'")


def check_bind_endpoint(text: str) -> None:
    check_zmq_endpoint(text, bind=True)


def check_optional_bind(text: str) -> None:
    if text:
        check_zmq_endpoint(text, bind=True)


def check_connect_endpoints(value: list[Any]) -> None:
    problems = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            problems.append(f"[{i}]: must be a string, got {item!r}")
            continue
        try:
            check_zmq_endpoint(item, bind=False)
        except ValueError as e:
            problems.append(f"[{i}]: {e}")
    if problems:
        raise Problems(problems)


def bind_option(default: Any, doc: str) -> Option:
    """A ZeroMQ endpoint to bind (``""`` = off when the default is ``""``)."""
    return Option(str, default, doc, check_optional_bind if default == "" else check_bind_endpoint)
