"""Swapping a partition's files for their compacted form, safely across crashes.

Owns the staging area ``<root>/_compaction/<partition key>/<run>/`` (``_``-prefixed, so
readers skip it), the commit marker and the swap steps:

1. the job writes the new files into the run's staging directory and audits them
   (row counts: outputs == inputs);
2. **commit marker**: ``_COMMIT.json`` in the run directory, listing the input files
   (to remove) and the output files (to move in), published atomically and durably.
   This is the commit point;
3. the new files are renamed into the partition directory (one atomic rename each);
4. the original files are removed;
5. the marker is removed, then the run directory.

A crash anywhere is repaired by ``recover`` (which every job runs first for the
partitions it works on, under the partition's lease): a run directory *with* a marker
is rolled forward (steps 3-5 redone; each step is idempotent: a file already moved or
already removed is skipped), one *without* a marker is rolled back (the directory is
deleted; the partition was never touched). So after any crash and one more run, every
row is in the partition exactly once.

What a concurrent reader can see: the partition is consistent before step 3 and
after step 4. Between the first rename of step 3 and the last removal of step 4 (a
few file-system metadata operations: milliseconds on a local disk, a few namenode
RPCs on HDFS) a reader that lists the directory may see both old and new files, and
so rows twice; a reader that listed it before the swap and opens an original file
after step 4 gets "file not found". Nothing is ever missing from a listing.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

COMPACTION_DIR = "_compaction"
MARKER = "_COMMIT.json"

#: Called with the name of each step just completed ("marker", "moved 1", "removed 1",
#: "unmarked", "done"); tests raise from it to simulate a crash there.
Hook = Callable[[str], None]


def _no_hook(step: str) -> None:
    pass


class SwapError(Exception):
    """The swap cannot go on safely (a file the marker promises is gone)."""


@dataclass(frozen=True)
class FileInfo:
    name: str
    bytes: int
    rows: int


def partition_dir(root: str, key: str) -> str:
    return posixpath.join(root, key)


def staging_dir(root: str, key: str) -> str:
    """Where every run of this partition stages its files."""
    return posixpath.join(root, COMPACTION_DIR, key)


def run_dir(root: str, key: str, run_id: str) -> str:
    return posixpath.join(staging_dir(root, key), run_id)


class Swap:
    """The swap of one run of one partition; each step callable on its own."""

    def __init__(self, fs: Any, root: str, key: str, run_id: str, hook: Hook = _no_hook) -> None:
        self.fs = fs
        self.root = root
        self.key = key
        self.run_id = run_id
        self.hook = hook
        self.partition_dir = partition_dir(root, key)
        self.run_dir = run_dir(root, key, run_id)
        self.marker = posixpath.join(self.run_dir, MARKER)

    def staged(self, name: str) -> str:
        return posixpath.join(self.run_dir, name)

    def final(self, name: str) -> str:
        return posixpath.join(self.partition_dir, name)

    # -- the steps ------------------------------------------------------------------

    def write_marker(self, inputs: Sequence[FileInfo], outputs: Sequence[FileInfo]) -> None:
        """Step 2, the commit point: from here on a crash is rolled forward."""
        rows_in = sum(f.rows for f in inputs)
        rows_out = sum(f.rows for f in outputs)
        if rows_in != rows_out:
            raise SwapError(f"{self.key}: audit failed: {rows_in} rows in, {rows_out} rows out")
        body = {
            "version": 1,
            "partition": self.key,
            "run": self.run_id,
            "rows": rows_in,
            "inputs": [asdict(f) for f in inputs],
            "outputs": [asdict(f) for f in outputs],
        }
        self.fs.create_exclusive(self.marker, json.dumps(body, indent=1).encode())
        self.hook("marker")

    def read_marker(self) -> dict[str, Any] | None:
        """The marker's content, or None if there is no (complete) marker."""
        try:
            data = json.loads(self.fs.read_bytes(self.marker))
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # cannot happen with create_exclusive; a damaged marker never committed
        return data if isinstance(data, dict) and "outputs" in data and "inputs" in data else None

    def move_outputs(self, outputs: Sequence[str]) -> None:
        """Step 3: rename the new files into the partition (skipping those already there)."""
        missing = [n for n in outputs if not self.fs.exists(self.staged(n)) and not self.fs.exists(self.final(n))]
        if missing:
            raise SwapError(
                f"{self.key}: run {self.run_id} committed but its output(s) {', '.join(missing)} are gone; "
                f"the originals are kept and the marker {self.marker} is left for an operator"
            )
        for number, name in enumerate(outputs, 1):
            if self.fs.exists(self.staged(name)):
                self.fs.replace(self.staged(name), self.final(name))
            self.hook(f"moved {number}")
        self.fs.sync_dir(self.partition_dir)

    def remove_inputs(self, inputs: Sequence[str]) -> None:
        """Step 4: remove the originals (skipping those already gone)."""
        for number, name in enumerate(inputs, 1):
            try:
                self.fs.remove(self.final(name))
            except FileNotFoundError:
                pass
            self.hook(f"removed {number}")
        self.fs.sync_dir(self.partition_dir)

    def finish(self) -> None:
        """Step 5: remove the marker, then the run's directory."""
        try:
            self.fs.remove(self.marker)
        except FileNotFoundError:
            pass
        self.fs.sync_dir(self.run_dir)
        self.hook("unmarked")
        self.fs.remove_tree(self.run_dir)
        _remove_if_empty(self.fs, staging_dir(self.root, self.key))
        self.hook("done")

    def commit(self, inputs: Sequence[FileInfo], outputs: Sequence[FileInfo]) -> None:
        """Steps 2-5."""
        self.write_marker(inputs, outputs)
        self.roll_forward()

    def roll_forward(self) -> None:
        marker = self.read_marker()
        if marker is None:
            raise SwapError(f"{self.key}: run {self.run_id} has no commit marker")
        self.move_outputs([f["name"] for f in marker["outputs"]])
        self.remove_inputs([f["name"] for f in marker["inputs"]])
        self.finish()

    def roll_back(self) -> None:
        """Delete the uncommitted run's staging (the partition was never touched)."""
        self.fs.remove_tree(self.run_dir)
        _remove_if_empty(self.fs, staging_dir(self.root, self.key))


def _remove_if_empty(fs: Any, directory: str) -> None:
    """Remove a partition's staging directory once no run is left in it (only the
    partition's lease holder works there, so nothing can appear in it meanwhile)."""
    if not fs.list_entries(directory):
        fs.remove_tree(directory)


def recover(fs: Any, root: str, key: str, hook: Hook = _no_hook) -> list[tuple[str, str]]:
    """Finish or undo every run of partition ``key`` a crash interrupted.

    Call it holding the partition's lease. Returns ``[(run, "rolled forward" | "rolled
    back")]``.
    """
    done = []
    base = staging_dir(root, key)
    for entry in fs.list_entries(base):
        if not entry.is_dir:
            continue
        swap = Swap(fs, root, key, entry.name, hook)
        if swap.read_marker() is not None:
            swap.roll_forward()
            action = "rolled forward"
        else:
            swap.roll_back()
            action = "rolled back"
        done.append((entry.name, action))
    return done


def interrupted(fs: Any, root: str) -> list[str]:
    """Keys of partitions with a run left in staging (a crashed or running job)."""
    keys = []
    base = posixpath.join(root, COMPACTION_DIR)
    for tag in fs.list_entries(base):
        if not tag.is_dir:
            continue
        for dt in fs.list_entries(posixpath.join(base, tag.name)):
            if not dt.is_dir:
                continue
            for hour in fs.list_entries(posixpath.join(base, tag.name, dt.name)):
                if hour.is_dir and any(e.is_dir for e in fs.list_entries(posixpath.join(base, tag.name, dt.name, hour.name))):
                    keys.append(f"{tag.name}/{dt.name}/{hour.name}")
    return keys
