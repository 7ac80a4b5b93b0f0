"""Iceberg commits that say what they cover: the writer and the spool range in each snapshot.

Every append of the ``iceberg`` sink records, in its snapshot's summary:

* ``logrouter.writer``: the writer id (one per router spool, sink and worker);
* ``logrouter.spool-id``: a random id of that spool's lifetime (kept in the sink's state
  beside the spool), so a spool that was deleted and started again at position 0 is
  never taken for the old one;
* ``logrouter.spool-start`` / ``logrouter.spool-end``: the spool positions the snapshot's
  files cover: every record of that spool before ``spool-end`` routed to the sink is in
  the table (in this snapshot or an earlier one), none after it.

``last_commit`` finds the writer's newest such snapshot by walking the main branch back
from its head: other writers' appends and compaction's ``replace`` snapshots (which
carry none of these keys) are passed over. That snapshot is the truth about what the
table holds, whatever the sink's own state file says; the sink resumes after its
``spool-end``.

``expire_snapshots`` may take the writer's last append out of the history (a router down
for longer than the retention while others commit). So the same transaction as every
append also sets the table property ``logrouter.writer.<writer id>.position`` to the
same spool id and range: table properties outlive snapshots, and the property changes
exactly when such an append lands. ``last_commit`` reads it when the walk finds no
append of the writer.

``append`` commits data files with these properties. pyiceberg retries a commit that lost
a race to another writer by itself (``commit.retry.*`` table properties); a conflict that
outlasts those retries is retried here, after checking the table, so it is never lost
and never doubled.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

WRITER = "logrouter.writer"
SPOOL_ID = "logrouter.spool-id"
SPOOL_START = "logrouter.spool-start"
SPOOL_END = "logrouter.spool-end"
POSITION_PROPERTY = "logrouter.writer.{writer}.position"  # a table property per writer

COMMIT_ATTEMPTS = 5  # each one pyiceberg's own retries, then a wait
_MAX_WALK = 1_000_000  # snapshots: bounded even for a corrupt parent chain


@dataclass(frozen=True)
class Committed:
    """A writer's newest append in the table (``snapshot_id`` None: known from the table
    property only, its snapshot expired)."""

    snapshot_id: int | None
    spool_id: str
    start: int
    end: int


def summary(writer_id: str, spool_id: str, start: int, end: int) -> dict[str, str]:
    return {WRITER: writer_id, SPOOL_ID: spool_id, SPOOL_START: str(start), SPOOL_END: str(end)}


def position_property(writer_id: str) -> str:
    return POSITION_PROPERTY.format(writer=writer_id)


def position_value(properties: dict[str, str]) -> str:
    """The table property's value for an append carrying ``properties`` (``summary``'s)."""
    return json.dumps({SPOOL_ID: properties[SPOOL_ID], SPOOL_START: int(properties[SPOOL_START]),
                       SPOOL_END: int(properties[SPOOL_END])}, sort_keys=True)


def last_commit(table: Any, writer_id: str) -> Committed | None:
    """The newest snapshot of the main branch committed by ``writer_id``; if the history
    has none (expired), what the writer's table property says; None if neither."""
    metadata = table.metadata
    snapshot = table.current_snapshot()
    for _ in range(_MAX_WALK):
        if snapshot is None:
            break
        found = snapshot.summary[WRITER] if snapshot.summary is not None else None
        if found == writer_id:
            s = snapshot.summary
            try:
                return Committed(snapshot.snapshot_id, s[SPOOL_ID] or "", int(s[SPOOL_START] or 0), int(s[SPOOL_END] or 0))
            except ValueError:
                return None  # not ours after all (a hand-made snapshot): nothing to resume from
        parent = snapshot.parent_snapshot_id
        snapshot = metadata.snapshot_by_id(parent) if parent is not None else None
    return _from_property(metadata.properties.get(position_property(writer_id)))


def _from_property(text: str | None) -> Committed | None:
    if not text:
        return None
    try:
        value = json.loads(text)
        return Committed(None, str(value[SPOOL_ID]), int(value[SPOOL_START]), int(value[SPOOL_END]))
    except (ValueError, KeyError, TypeError):
        return None  # not ours (set by hand): nothing to resume from


def append(
    table: Any,
    data_files: Sequence[Any],
    properties: dict[str, str],
    attempts: int = COMMIT_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    on_conflict: Callable[[int, Exception], None] | None = None,
) -> None:
    """Commit ``data_files`` as one append carrying ``properties`` in its summary, and
    the writer's position in the table's properties.

    A ``CommitFailedException`` (the catalog refused the commit: it did not land) is
    retried up to ``attempts`` times, after checking that the append is not in the table
    already. Any other exception leaves the outcome unknown and is raised: the caller
    looks at the table (``last_commit``) before it does anything else.
    """
    from pyiceberg.exceptions import CommitFailedException  # noqa: PLC0415

    end = int(properties[SPOOL_END])
    for attempt in range(attempts):
        try:
            with table.transaction() as transaction:
                # In the same transaction as the files: the property changes if and only if they land.
                transaction.set_properties({position_property(properties[WRITER]): position_value(properties)})
                with transaction.update_snapshot(snapshot_properties=properties).fast_append() as files:
                    for data_file in data_files:
                        files.append_data_file(data_file)
            return
        except CommitFailedException as e:
            if attempt == attempts - 1:
                raise
            if on_conflict is not None:
                on_conflict(attempt + 1, e)
            sleep(min(5.0, 0.2 * 2**attempt))
            table.refresh()
            landed = last_commit(table, properties[WRITER])
            if landed is not None and landed.spool_id == properties[SPOOL_ID] and landed.end >= end:
                return
