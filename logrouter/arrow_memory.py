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
filesystems when it is imported, if the wheel has them: ``libarrow_s3`` and the AWS SDK's
start-up take ~3 MiB of resident memory in each worker. A router's lake and Iceberg
warehouse are on a local disk or HDFS (``logrouter.lake.fs``,
``iceberg_catalog.check_warehouse``), so the entry points have ``pyarrow.fs`` imported
with those modules hidden (``skip_cloud_filesystems``): it lists them as not built, as
for a wheel without them. Only while ``pyarrow.fs`` runs: pyiceberg, which imports
``pyarrow._s3fs`` itself, still finds it (an Iceberg sink's worker loads it then).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any, MutableMapping, Sequence

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


def skip_cloud_filesystems(meta_path: list = sys.meta_path) -> None:
    """Have ``pyarrow.fs``, when it is first imported, imported with the cloud
    filesystems' modules hidden (nothing to do if it is loaded already)."""
    if "pyarrow.fs" not in sys.modules and not any(isinstance(f, _FsWithoutCloud) for f in meta_path):
        meta_path.insert(0, _FsWithoutCloud())


class _HideCloud(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> None:
        if name in CLOUD_FILESYSTEMS:
            raise ModuleNotFoundError(f"No module named {name!r} (not loaded by a router)", name=name)
        return None


class _FsWithoutCloud(importlib.abc.MetaPathFinder):
    """Finds ``pyarrow.fs`` as the other finders do, with a loader that runs it while
    ``_HideCloud`` is first on ``sys.meta_path``; then steps aside."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> Any:
        if name != "pyarrow.fs":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderWithoutCloud(spec.loader, self)
        return spec


class _LoaderWithoutCloud(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _FsWithoutCloud) -> None:
        self.loader = loader
        self.finder = finder

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)  # get_source, get_code, is_package, …

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        hide = _HideCloud()
        sys.meta_path.insert(0, hide)
        try:
            self.loader.exec_module(module)
        finally:
            sys.meta_path.remove(hide)
            if self.finder in sys.meta_path:
                sys.meta_path.remove(self.finder)
