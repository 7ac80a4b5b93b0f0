"""The health document of one router: is it serving as configured, and if not, what is wrong.

``GET /health`` answers a JSON object (``logrouter.http_endpoint``); this module builds
the part one router (a single process, or one worker) knows::

    {"status": "ok" | "failing",
     "problems": ["sink lake: failing (retried; 1200 bytes wait in the spool)", …],
     "spool": {"state": "ok" | "full" | "failing", "backlog_bytes": 0},
     "sources": {"forward": {"state": "listening" | "left out"}, …},
     "sinks": {"lake": {"state": "live" | "catching up" | "failing" | "starting" | "left out",
                        "lag_bytes": 0}, …}}

``status`` is ``ok`` exactly when ``problems`` is empty (the endpoint then answers 200,
else 503). A problem is what keeps the router from doing what its config says: a source
or sink a reload left out (it could not start), a sink that is failing or has not
started, a spool that refuses writes, a router that is stopping. A full spool (the
sources wait for the sinks) and a sink catching up from the spool are the designed
backpressure, shown but not problems. Reading only, from the router's own attributes.
"""

from __future__ import annotations

from typing import Any

OK = "ok"
FAILING = "failing"


def status_of(problems: list[str]) -> str:
    return FAILING if problems else OK


def router_health(router: Any) -> dict[str, Any]:
    """The health document of one running ``Router`` (``logrouter.router``)."""
    problems: list[str] = []
    if router is None:
        return {"status": FAILING, "problems": ["the router has not started"], "spool": {}, "sources": {}, "sinks": {}}
    if getattr(router, "stopping", False) or getattr(router, "stop_requested", False):
        problems.append("stopping")
    backlog = router.backlog_bytes()
    if getattr(router, "spool_failing", False):
        spool = "failing"
        problems.append("spool: writes fail (disk full?); the sources wait and retry")
    else:
        spool = "full" if getattr(router, "paused", False) else "ok"
    left_out = set(getattr(router, "left_out", ()))
    sources: dict[str, dict[str, Any]] = {name: {"state": "listening"} for name in router.sources}
    sinks: dict[str, dict[str, Any]] = {}
    for name, sink in router.sinks.items():
        feed = router.feeds.get(name)
        lag = max(router.spool.end - sink.cursor, 0)
        if getattr(sink, "failing", False):
            state = "failing"
            problems.append(f"sink {name}: failing (retried; {lag} bytes wait in the spool)")
        elif feed is None or not feed.started:
            state = "starting"
            problems.append(f"sink {name}: starting (recovering its state)")
        else:
            state = "live" if feed.live else "catching up"
        sinks[name] = {"state": state, "lag_bytes": lag}
    for entry in sorted(left_out):
        kind, _, rest = entry.partition(".")
        name = rest.partition(": ")[0]  # "sources.beats", or with the reason after ": "
        if kind == "sources" and name not in sources:
            sources[name] = {"state": "left out"}
            problems.append(f"source {name}: not running (it could not start in the last reload; the next one retries)")
        elif kind == "sinks" and name not in sinks:
            sinks[name] = {"state": "left out"}
            problems.append(f"sink {name}: not running (it could not start in the last reload; the next one retries)")
    return {
        "status": status_of(problems),
        "problems": problems,
        "spool": {"state": spool, "backlog_bytes": backlog},
        "sources": sources,
        "sinks": sinks,
    }

