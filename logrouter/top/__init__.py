"""``logrouter top``: a live terminal view of a running router, read from its ``/metrics``.

``snapshot`` reads one metrics page into the numbers the view shows (sources, filters,
sinks, spool, workers); ``view`` draws two snapshots (rates come from their difference)
as ``rich`` tables, a pure function tested without a terminal; ``command`` is the
command itself: where the page is, the fetch every second, the live screen.
"""
