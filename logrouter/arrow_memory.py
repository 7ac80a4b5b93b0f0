"""Which allocator Arrow's buffers come from in a router process.

pyarrow 26's wheels default to mimalloc. Under the forward benchmark each worker's
resident memory grew ~10 MiB more with it than with jemalloc, which pyarrow's Linux
wheels also carry, at the same CPU per event (``docs/operations/memory.md``): mimalloc
keeps the pages of freed row-group buffers mapped, jemalloc hands them back after its
decay time. The entry points (``twistd logrouter``, a worker) call ``prefer_jemalloc``
before anything imports pyarrow; Arrow reads ``ARROW_DEFAULT_MEMORY_POOL`` when it
first allocates, and the workers inherit the supervisor's environment.

An operator's own ``ARROW_DEFAULT_MEMORY_POOL`` wins (``mimalloc``, ``system``). Only on
Linux: elsewhere pyarrow builds without jemalloc are common, and Arrow would warn on
every start that the backend is missing.
"""

from __future__ import annotations

import os
import sys
from typing import MutableMapping

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def prefer_jemalloc(environ: MutableMapping[str, str] = os.environ, platform: str = sys.platform) -> None:
    """Ask Arrow for its jemalloc pool unless the environment already names one."""
    if platform.startswith("linux") and not environ.get(POOL_VARIABLE):
        environ[POOL_VARIABLE] = "jemalloc"
