"""logrouter: a Twisted log router that lands what it acknowledges as Parquet."""

__version__ = "0.1.0"
