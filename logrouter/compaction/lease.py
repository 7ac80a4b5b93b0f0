"""Per-partition leases kept in the lake, so two routers sharing a lake never compact
the same partition at the same time.

A lease is a directory ``<root>/_leases/<partition key>/`` of small JSON files
``lease-<generation>.json`` (``{"owner", "state": "held"|"released", "expires", …}``).
The file with the highest generation says who holds the partition. Every change is
the *exclusive creation* of the next generation (``create_exclusive``: O_EXCL-like,
``link(2)`` on a local disk, a rename that refuses an existing name on HDFS), so of
two routers racing for the same generation exactly one wins:

* acquire: the highest generation is absent, released, or held but past ``expires``
  (a crashed holder) → create generation + 1 as ``held``;
* release: create generation + 1 as ``released`` (if that fails, someone took the
  lease over after it expired: nothing to do);
* older generations are deleted by whoever wins; nobody looks at them.

Taking over a stale lease is therefore as safe as taking a free one: there is no
"delete the stale file, then create" window in which two routers could both win.
Expiry uses the caller's clock (``now``, seconds since the epoch); routers sharing a
lake need roughly synchronised clocks (NTP), and ``ttl`` must exceed the job's
timeout, which the scheduler guarantees.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

LEASES_DIR = "_leases"
_LEASE_FILE = re.compile(r"lease-(\d{12})\.json")


@dataclass(frozen=True)
class Lease:
    key: str
    generation: int
    owner: str
    expires: float
    path: str


def lease_dir(root: str, key: str) -> str:
    return posixpath.join(root, LEASES_DIR, key)


def _name(generation: int) -> str:
    return f"lease-{generation:012d}.json"


def _generations(fs: Any, directory: str) -> list[int]:
    found = []
    for entry in fs.list_entries(directory):
        match = _LEASE_FILE.fullmatch(entry.name)
        if match and not entry.is_dir:
            found.append(int(match.group(1)))
    return sorted(found)


def _read(fs: Any, path: str) -> dict[str, Any] | None:
    """A lease file's content; None if it vanished; {} if it is not a lease (free).

    Lease files are published whole (``create_exclusive``), so an unreadable one was
    damaged by hand: it is treated as free rather than blocking the partition forever.
    I/O errors propagate (a namenode hiccup must not look like a free lease).
    """
    try:
        raw = fs.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def current(fs: Any, root: str, key: str) -> tuple[int, dict[str, Any] | None]:
    """The highest generation and its content (0, None when there is none)."""
    directory = lease_dir(root, key)
    for _ in range(5):  # a generation may be deleted between listing and reading
        generations = _generations(fs, directory)
        if not generations:
            return 0, None
        data = _read(fs, posixpath.join(directory, _name(generations[-1])))
        if data is not None:
            return generations[-1], data
    raise OSError(f"lease of {key} keeps changing under us")


def holder(data: dict[str, Any] | None, now: float) -> str | None:
    """The owner holding a lease described by ``data`` at ``now``, or None if it is free."""
    if not data or data.get("state") != "held":
        return None  # no lease, released, or not a lease
    expires = data.get("expires")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool) or expires <= now:
        return None  # expired: the holder crashed or overran
    return str(data.get("owner", "?"))


def acquire(fs: Any, root: str, key: str, owner: str, now: float, ttl: float) -> Lease | None:
    """Take the partition's lease for ``ttl`` seconds, or None if someone else holds it."""
    directory = lease_dir(root, key)
    fs.makedirs(directory)
    generation, data = current(fs, root, key)
    if holder(data, now) is not None:
        return None
    mine = generation + 1
    path = posixpath.join(directory, _name(mine))
    body = {"owner": owner, "state": "held", "acquired": now, "expires": now + ttl, "partition": key}
    try:
        fs.create_exclusive(path, json.dumps(body).encode())
    except FileExistsError:
        return None  # another router won this generation
    _forget_before(fs, directory, mine)
    return Lease(key, mine, owner, now + ttl, path)


def held_by(fs: Any, root: str, lease: Lease, now: float) -> bool:
    """Whether ``lease`` is still the partition's current, unexpired lease."""
    generation, data = current(fs, root, lease.key)
    return generation == lease.generation and holder(data, now) == lease.owner


def find(fs: Any, root: str, key: str, owner: str, now: float) -> Lease | None:
    """The current lease of ``key`` if ``owner`` holds it (a job started by a holder)."""
    generation, data = current(fs, root, key)
    if holder(data, now) != owner or data is None:
        return None
    path = posixpath.join(lease_dir(root, key), _name(generation))
    return Lease(key, generation, owner, float(data.get("expires", 0)), path)


def release(fs: Any, root: str, lease: Lease, now: float) -> bool:
    """Give the lease back; False if it had already been taken over."""
    directory = lease_dir(root, lease.key)
    generation, data = current(fs, root, lease.key)
    if generation != lease.generation:
        return False
    path = posixpath.join(directory, _name(generation + 1))
    body = {"owner": lease.owner, "state": "released", "released": now, "partition": lease.key}
    try:
        fs.create_exclusive(path, json.dumps(body).encode())
    except FileExistsError:
        return False
    _forget_before(fs, directory, generation + 1)
    return True


def _forget_before(fs: Any, directory: str, generation: int) -> None:
    for old in _generations(fs, directory):
        if old < generation:
            try:
                fs.remove(posixpath.join(directory, _name(old)))
            except FileNotFoundError:
                pass
