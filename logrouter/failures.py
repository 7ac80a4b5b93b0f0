"""Failures that more than one layer names: a batch the spool cannot hold, and how a
process that cannot do its job ends.

``UnstorableBatch`` is raised by the router's ingest (the batch cannot be encoded, or is
over the spool's record limit) and checked by sources that split a refused batch and
try its halves. ``EXIT_FAILURE`` is the exit status of a process that could not do its
job (a refused config, a failed start); it has said why before it exits.
"""

from __future__ import annotations

import os
import sys

EXIT_FAILURE = 1


class UnstorableBatch(ValueError):
    """A batch the spool cannot hold (it cannot be encoded, or is too large): refused, never acked."""


def exit_failed() -> None:
    """End the process at once with ``EXIT_FAILURE``, after flushing what it printed
    (for a process whose reactor has already stopped, where ``SystemExit`` is too late)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAILURE)
