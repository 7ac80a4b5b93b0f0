"""The config ``make run`` serves (``etc/logrouter.toml``) with free ports: for the tests
that start the real daemon on it (the quick start, one event per protocol)."""

from __future__ import annotations

import re

#: The documented default ports of the shipped config, and the source (or endpoint) of each.
PORTS = {
    24224: "sources.forward",
    5044: "sources.beats",
    5043: "sources.courier",
    9604: "sources.logjam (ROUTER)",
    9605: "sources.logjam (PULL)",
    9090: "sources.pravega (controller)",
    12345: "sources.pravega (segment store)",
    24229: "router.metrics_listen",
}


def any_free_port(text: str) -> str:
    """The shipped config with each listening port (the documented ones) replaced by any free one."""
    replaced: list[int] = []

    def any_port(m: re.Match) -> str:
        replaced.append(int(m.group(1) or m.group(2)))
        return '"tcp:0:interface=127.0.0.1"' if m.group(1) else '"tcp://127.0.0.1:*"'

    changed = re.sub(r'"tcp:(\d+):interface=127\.0\.0\.1"|"tcp://127\.0\.0\.1:(\d+)"', any_port, text)
    assert sorted(replaced) == sorted(PORTS)
    return changed
