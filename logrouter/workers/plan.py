"""What each worker process runs: its config, derived from the one config file.

Pure functions, no Twisted: the supervisor and the workers both call them, and a reload
in a worker derives its config again the same way.

- A *shared* source is a stream source listening on TCP or TLS (``tcp:``/``ssl:``):
  the supervisor binds it and passes each accepted connection to one worker. Every other
  source (a ZeroMQ subscriber, a Pravega source with its controller, a unix socket) runs
  in worker 0 only, listening or connecting by itself.
- Worker ``i`` keeps its spool in ``<spool.path>`` for ``i = 0`` (so a router that goes
  from one process to several keeps its backlog) and in ``<spool.path>/worker-<i>``
  otherwise; sinks that name their files (parquet ``writer_id``, file ``prefix``) get
  ``-w<i>`` added so two workers never write the same file.
- Compaction and the metrics endpoint run in the supervisor only (it asks each worker
  for its metrics over the channel).
- A connection goes to worker ``crc32(peer IP) % N``: the same client always lands on
  the same worker, so a batch it resends after a reconnect meets the dedupe window of
  the worker that stored it.
- ``auto`` is the CPUs of the process's affinity, capped by a cgroup CPU limit; with
  ``pin_workers`` worker ``i`` runs on the ``i``-th of those CPUs only.
"""

from __future__ import annotations

import copy
import math
import os
import re
import zlib
from typing import Any

from logrouter.config import sections
from logrouter.config.endpoints import listen_address

WORKER_DIR = re.compile(r"^worker-([1-9][0-9]*)$")


def is_shared(component: Any) -> bool:
    """Whether the supervisor accepts this source's connections and hands them out."""
    if component.kind != "sources" or not getattr(component.cls, "SHAREABLE", False):
        return False
    listen = component.options.get("listen")
    if not isinstance(listen, str):
        return False
    try:
        return listen_address(listen) is not None
    except ValueError:
        return False


def shared_sources(config: Any) -> list[str]:
    return [name for name, component in config.sources.items() if is_shared(component)]


def worker_for(host: str | None, count: int) -> int:
    """The worker a peer's connections go to: stable across restarts (not Python's hash)."""
    if count <= 1 or not host:
        return 0
    return zlib.crc32(host.encode("utf-8", "surrogateescape")) % count


def spool_path(base: str, index: int) -> str:
    return base if index == 0 else os.path.join(base, f"worker-{index}")


def leftover_workers(base: str) -> int:
    """One more than the highest worker index with a spool directory under ``base``
    (0 when there is none): a router run before with more workers left their spools,
    whose backlog still has to reach the sinks."""
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    found = [int(m.group(1)) for m in map(WORKER_DIR.match, names) if m and os.path.isdir(os.path.join(base, m.group(0)))]
    return max(found, default=-1) + 1


def workers(config: Any) -> tuple[int, str]:
    """The worker count connections are spread over, and why when ``auto`` chose it."""
    setting = config.router["workers"]
    if setting != "auto":
        return int(setting), ""
    if not shared_sources(config):
        return 1, "no TCP/TLS source to share"
    single = single_process_reasons(config.sources, config.sinks)
    if single:
        return 1, single[0]
    cores = len(allowed_cpus())
    quota = cpu_quota()
    if quota is not None and math.ceil(quota) < cores:
        limited = max(1, math.ceil(quota))
        return limited, f"the cgroup's CPU limit of {quota:g} CPUs ({cores} cores in this process's affinity)"
    return max(1, cores), f"the {cores} cores this process may use"


def cpu_quota(cgroup_root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup") -> float | None:
    """The CPUs' worth of time the cgroups let this process use (a container's CPU limit:
    cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; the smallest
    along the way up from its own cgroup), or None when there is no limit or it cannot
    be read. The CPU affinity does not show such a limit."""
    try:
        with open(self_cgroup) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        lines = []
    v2 = next((fields[2] for fields in lines if len(fields) == 3 and fields[:2] == ["0", ""]), "/")
    v1 = next((fields[2] for fields in lines if len(fields) == 3 and "cpu" in fields[1].split(",")), "/")
    limits = [_v2_limit(place) for place in _up_from(cgroup_root, v2)]
    limits += [_v1_limit(place) for place in _up_from(os.path.join(cgroup_root, "cpu"), v1)]
    return min((limit for limit in limits if limit is not None), default=None)


def _up_from(root: str, path: str) -> list[str]:
    """``root/path`` and each directory above it up to ``root`` (a container sees its own
    cgroup at the root, whatever the path says)."""
    parts = [part for part in path.split("/") if part and part != ".."]
    return [os.path.join(root, *parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_limit(place: str) -> float | None:
    try:
        with open(os.path.join(place, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else _ratio(quota, period)


def _v1_limit(place: str) -> float | None:
    try:
        with open(os.path.join(place, "cpu.cfs_quota_us")) as f:
            quota = f.read().strip()
        with open(os.path.join(place, "cpu.cfs_period_us")) as f:
            period = f.read().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        value = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return value if value > 0 else None  # -1: no limit


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, in order (all of them where that is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def worker_cpu(config: Any, index: int, cpus: list[int]) -> int | None:
    """The CPU worker ``index`` is bound to (``pin_workers``), in turn over ``cpus``; None
    when it is not bound (the setting is off, or there is one CPU to run on)."""
    if not config.router.get("pin_workers", True) or len(cpus) < 2:
        return None
    return cpus[index % len(cpus)]


def processes(config: Any) -> int:
    """How many worker processes to run: ``workers``, or more to drain the spools left by
    a larger ``workers`` before (those extra workers get no connections)."""
    return max(workers(config)[0], leftover_workers(config.spool["path"]))


def worker_config(config: Any, index: int, count: int, accepted: set[str] | None = None) -> Any:
    """The config worker ``index`` of ``count`` runs (a copy; ``config`` is unchanged).

    ``accepted``: the shared sources the supervisor listens for. A shared source it does
    not (the file gained one the supervisor has not applied yet, e.g. a worker started
    again after the file was edited) is left out: the workers must not all bind it."""
    derived = copy.deepcopy(config)
    if accepted is not None:
        derived.sources = {n: c for n, c in derived.sources.items() if not is_shared(c) or n in accepted}
    derived.router["workers"] = 1
    derived.router["metrics_listen"] = ""
    derived.spool["path"] = spool_path(config.spool["path"], index)
    if index != 0:
        derived.sources = {name: c for name, c in derived.sources.items() if is_shared(c)}
    for sink in derived.sinks.values():
        adjust = getattr(sink.cls, "worker_options", None)
        if adjust is not None:
            sink.options = adjust(sink.name, sink.options, index)
    derived.compaction["enabled"] = False
    return derived


def single_process_reasons(sources: dict[str, Any], sinks: dict[str, Any]) -> list[str]:
    """What in the config only one process can run (``path: why``)."""
    reasons = []
    for component in sources.values():
        listen = component.options.get("listen")
        if isinstance(listen, str) and listen.strip().lower().startswith("systemd:"):
            reasons.append(f"{component.path}.listen: systemd socket activation passes the socket to one process")
    for component in sinks.values():
        reason = getattr(component.cls, "SINGLE_PROCESS", None)
        if reason:
            reasons.append(f"{component.path}: {reason}")
    return reasons


def check(sources: dict[str, Any], sinks: dict[str, Any], workers: int) -> list[str]:
    """Config errors (``path: message``) that only an explicit ``workers`` above 1 makes
    (``auto`` falls back to one process instead)."""
    if workers <= 1:
        return []
    return [f"{reason}; it needs [router] workers = 1" for reason in single_process_reasons(sources, sinks)]


@sections.register_check
def check_config(tables: sections.Tables) -> list[str]:
    """``check`` in config validation (registered with ``config.sections``)."""
    workers = tables.router.get("workers", 1)
    return check(tables.sources, tables.sinks, workers if type(workers) is int else 1)
