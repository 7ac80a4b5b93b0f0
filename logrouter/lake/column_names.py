"""Which names a lake column may have, and the type names a config may declare.

The rules on names only, without pyarrow: ``schema.py`` (the column types of a writer)
applies them, and so does the config check of the ``columns`` option, which runs in every
process, the supervisor of ``[router] workers`` too, which never writes the lake (so it
never loads pyarrow: docs/operations/memory.md).
"""

from __future__ import annotations

from typing import Any, Mapping

from logrouter.lake.partition import PARTITION_COLUMNS

TIME = "time"
EXTRA = "_extra"

#: Names no record field may use as a column, in Spark's case-insensitive sense.
RESERVED = frozenset(name.casefold() for name in (TIME, EXTRA, *PARTITION_COLUMNS))

#: Names a configuration may use to declare a column's type -> the column type's name.
DECLARED_TYPES = {
    "bool": "bool",
    "int": "int64",
    "int64": "int64",
    "float": "float64",
    "float64": "float64",
    "double": "float64",
    "string": "string",
    "binary": "binary",
}


def usable(name: Any, taken: set[str]) -> bool:
    """Whether ``name`` can be a column beside the columns whose case-folded names are
    ``taken``: a non-empty str, valid UTF-8, not reserved, not one of them ignoring case."""
    if type(name) is not str or not name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    folded = name.casefold()
    return folded not in RESERVED and folded not in taken


def check_declared(declared: Mapping[str, Any]) -> None:
    """``ValueError`` naming the first declared column (name -> type name) that cannot be."""
    taken: set[str] = set()
    for name, type_name in declared.items():
        if not isinstance(type_name, str) or type_name not in DECLARED_TYPES:
            raise ValueError(f"column {name!r}: type must be one of {sorted(DECLARED_TYPES)}, not {type_name}")
        if not usable(name, taken):
            raise ValueError(f"column {name!r} cannot be declared: reserved or duplicate name")
        taken.add(name.casefold())
