"""Several router processes on one machine: ``[router] workers = N``.

One Python process uses one core. With ``workers`` above 1 the twistd process becomes a
supervisor (``supervisor.py``) that runs no router itself: it binds the listening
sockets of the sources that can be shared, starts N worker processes (``worker.py``),
each a whole router with its own spool directory and lake writer id, and hands every
accepted connection to one of them over a Unix socket (``channel.py``). ``plan.py``
decides what each worker runs; ``metrics.py`` sums the workers' metrics.
"""
