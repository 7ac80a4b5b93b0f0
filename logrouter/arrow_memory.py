"""Arrow in a router process: which allocator its buffers come from, and which of
pyarrow's libraries it loads.

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

``pyarrow.fs`` (which ``pyarrow.parquet`` imports) loads pyarrow's S3, GCS and Azure
filesystems if the wheel has them: ``libarrow_s3`` and the AWS SDK's start-up take ~3 MiB
of resident memory in each worker. A router's lake and Iceberg warehouse are on a local
disk or HDFS only (``logrouter.lake.fs``, ``iceberg_catalog.check_warehouse``), so the
entry points keep those modules from loading (``skip_cloud_filesystems``): ``pyarrow.fs``
then lists them as not built, as it does for a wheel without them.
"""

from __future__ import annotations

import os
import sys
from typing import MutableMapping

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
CLOUD_FILESYSTEMS = ("pyarrow._s3fs", "pyarrow._gcsfs", "pyarrow._azurefs")


def prepare_arrow() -> None:
    """What the entry points call before anything imports pyarrow."""
    prefer_jemalloc()
    skip_cloud_filesystems()


def prefer_jemalloc(environ: MutableMapping[str, str] = os.environ, platform: str = sys.platform) -> None:
    """Ask Arrow for its jemalloc pool unless the environment already names one."""
    if platform.startswith("linux") and not environ.get(POOL_VARIABLE):
        environ[POOL_VARIABLE] = "jemalloc"


def skip_cloud_filesystems(modules: MutableMapping[str, object] = sys.modules) -> None:
    """Make importing pyarrow's cloud filesystems fail as if they were not built (a
    ``None`` in ``sys.modules`` makes ``import`` raise ``ImportError``), unless one is
    loaded already."""
    for name in CLOUD_FILESYSTEMS:
        modules.setdefault(name, None)
