"""Config texts the end-to-end tests share: the smallest useful router, one forward
source on a free loopback port into a Parquet lake, with spool and lake relative to the
daemon's working directory. A test appends what it needs (more keys of the sink go right
after it, since the sink's table comes last)."""

FORWARD_TO_LAKE = """
[spool]
path = "spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"

[sinks.lake]
type = "parquet"
inputs = ["forward"]
path = "lake"
"""
