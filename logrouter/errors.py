"""Where records that a filter or sink could not handle go: logged and counted.

A record that fails never takes its batch down with it; the component reports it here
and carries on with the rest.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from twisted.logger import Logger


class ErrorPath(Protocol):
    def __call__(self, component: str, tag: str, record: Any, reason: str) -> None: ...


class LoggedErrors:
    """The default error path: one log line per failed record and a counter per component."""

    log = Logger(namespace="logrouter.errors")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, component: str, tag: str, record: Any, reason: str) -> None:
        self.counts[component] = self.counts.get(component, 0) + 1
        self.log.warn(
            "{component}: record dropped to error path (tag={tag}): {reason}",
            component=component,
            tag=tag,
            reason=reason,
        )

    def samples(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """Records dropped to the error path, per filter or sink (``logrouter.metrics`` renders them)."""
        for name, count in self.counts.items():
            yield "logrouter_error_path_records_total", "counter", {"component": name}, count
