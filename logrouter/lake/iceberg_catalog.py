"""The Iceberg catalog: its pyiceberg properties from the config, checked, and opened.

The one place that turns an ``iceberg`` sink's settings (and any other tool's: ``logrouter
lake``, compaction) into a pyiceberg catalog, so every part of logrouter and every reader
configured from the same settings sees the same tables:

* ``catalog`` is the catalog's *name*. A SQL catalog keys each table's row by it, so
  pyiceberg, Spark's ``JdbcCatalog`` and every router must use the same name, or each
  sees no tables of the others.
* ``catalog_uri`` is the SQLAlchemy URL of the SQL catalog's database. Empty: a SQLite
  file ``catalog.db`` inside the (local) warehouse directory, no server to run. For
  several routers or machines: PostgreSQL, ``postgresql+psycopg2://user:pass@host/db``.
* ``warehouse`` is where new tables get their data and metadata (a local directory,
  ``file://`` or ``hdfs://``).
* ``catalog_properties`` passes any other pyiceberg catalog property through unchanged,
  e.g. ``py-io-impl`` naming the ``FileIO`` class for ``hdfs://`` warehouses.

Opening a catalog connects to its database (and creates the catalog's tables in an empty
one): call ``open_catalog`` off the reactor thread.

Several writers may open one new catalog at the same moment (the workers of a router, several
routers). pyiceberg checks, then creates, both the catalog's own tables and a namespace's
row, so two writers can both find nothing and both create; the database refuses the second.
``open_catalog`` and ``ensure_namespace`` take that refusal as what it is, another writer's
creation, and look again.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Mapping

from logrouter.config.options import Problems

DEFAULT_CATALOG = "lake"
DEFAULT_TABLE = "logs.events"
SQLITE_FILE = "catalog.db"
CATALOG_TYPE = "sql"

#: Properties set by keys of their own; ``catalog_properties`` may not repeat them.
OWN_PROPERTIES = {"uri": "catalog_uri", "warehouse": "warehouse"}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,127}")
_IDENTIFIER_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
_URI_SCHEMES = ("sqlite", "postgresql")
CREATION_ATTEMPTS = 3  # a creation race is lost once; a database that refuses again is broken


def check_catalog_name(value: str) -> None:
    if not _NAME.fullmatch(value):
        raise ValueError(f"must be a name of letters, digits, '_' and '-' (as Spark's spark.sql.catalog.<name>), got {value!r}")


def table_identifier(value: str) -> tuple[str, ...]:
    """``"logs.events"`` → ``("logs", "events")``: namespace parts, then the table."""
    return tuple(value.split("."))


def check_table(value: str) -> None:
    parts = table_identifier(value)
    if len(parts) < 2 or not all(_IDENTIFIER_PART.fullmatch(p) for p in parts):
        raise ValueError(f"must be <namespace>.<table> of letters, digits, '_' and '-' (e.g. {DEFAULT_TABLE!r}), got {value!r}")


def check_catalog_uri(value: str) -> None:
    if not value:
        return  # the SQLite file in the warehouse
    scheme = value.partition("://")[0]
    if "://" not in value or scheme.partition("+")[0].lower() not in _URI_SCHEMES:
        raise ValueError(
            "must be a SQLAlchemy URL of the SQL catalog's database: sqlite:////path/catalog.db or "
            f"postgresql+psycopg2://user:password@host:5432/database, got {redact(value)!r}"
        )


def check_catalog_properties(value: Mapping[str, Any]) -> None:
    problems = []
    for key, item in value.items():
        if key in OWN_PROPERTIES:
            problems.append(f".{key}: set by the sink's key {OWN_PROPERTIES[key]!r}, not here")
        elif key == "type" and item != CATALOG_TYPE:
            problems.append(f".{key}: only the SQL catalog ({CATALOG_TYPE!r}) is supported, got {item!r}")
        elif not isinstance(item, str):
            problems.append(f".{key}: must be a string (pyiceberg properties are strings), got {item!r}")
    if problems:
        raise Problems(problems)


def check_warehouse(value: str) -> None:
    if not value:
        raise ValueError("must not be empty")
    if "://" in value and value.partition("://")[0].lower() not in ("file", "hdfs"):
        raise ValueError(f"must be a directory, file:// or hdfs:// URL, got {value!r}")


def warehouse_url(warehouse: str) -> str:
    """The warehouse as a URL: a plain path becomes ``file:///absolute/path``."""
    if "://" in warehouse:
        return warehouse.rstrip("/")
    return "file://" + os.path.abspath(warehouse)


def is_local(warehouse: str) -> bool:
    return warehouse_url(warehouse).startswith("file://")


def default_uri(warehouse: str) -> str:
    """The embedded catalog: ``catalog.db`` in a local warehouse directory."""
    if not is_local(warehouse):
        raise ValueError(f"a warehouse on {warehouse.partition('://')[0]}:// needs catalog_uri (a SQLite file on a local disk, or PostgreSQL)")
    return "sqlite:///" + os.path.join(warehouse_url(warehouse)[len("file://"):], SQLITE_FILE)


def check_settings(warehouse: str, uri: str) -> list[str]:
    """Cross-key problems (``key: message``) of a warehouse and catalog URI."""
    if not uri and not is_local(warehouse):
        return [f"catalog_uri: must be set for a warehouse on {warehouse.partition('://')[0]}:// "
                "(a SQLite file on a local disk, or PostgreSQL for several routers)"]
    return []


def catalog_properties(warehouse: str, uri: str = "", extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every pyiceberg property of the catalog: ``extra`` first, then the ones with keys of their own."""
    return {
        "type": CATALOG_TYPE,
        # A pooled connection the database dropped (a restart, a cut) is replaced, not failed on.
        "pool_pre_ping": "true",
        **dict(extra or {}),
        "uri": uri or default_uri(warehouse),
        "warehouse": warehouse_url(warehouse),
    }


def redact(uri: str) -> str:
    """``uri`` without its password, for log lines and errors."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", uri)


def open_catalog(name: str, properties: Mapping[str, str]) -> Any:
    """The pyiceberg catalog (blocking: it connects, and creates its tables if absent)."""
    from pyiceberg.catalog import load_catalog  # noqa: PLC0415 - heavy, only where a catalog is used

    uri = properties.get("uri", "")
    if uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(uri[len("sqlite:///"):]) or ".", exist_ok=True)
    warehouse = properties.get("warehouse", "")
    if warehouse.startswith("file://"):
        os.makedirs(warehouse[len("file://"):], exist_ok=True)
    return _after_a_lost_race(lambda: load_catalog(name, **properties))


def ensure_namespace(catalog: Any, namespace: tuple[str, ...]) -> None:
    """Create ``namespace`` unless it exists (blocking), whoever else creates it meanwhile."""

    _after_a_lost_race(lambda: catalog.create_namespace_if_not_exists(namespace))


def _after_a_lost_race(create: Callable[[], Any], sleep: Callable[[float], None] = time.sleep) -> Any:
    """``create()``, again if the database refused it because another writer created the same
    thing first (SQLite: "already exists", a UNIQUE constraint; PostgreSQL: a duplicate
    table or key): the next attempt finds it and goes on. Any other error, or the same
    refusal ``CREATION_ATTEMPTS`` times, is raised."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError  # noqa: PLC0415

    for attempt in range(CREATION_ATTEMPTS):
        try:
            return create()
        except (IntegrityError, OperationalError, ProgrammingError) as e:
            if attempt == CREATION_ATTEMPTS - 1 or not _lost_a_creation_race(e):
                raise
            sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _lost_a_creation_race(error: Exception) -> bool:
    from sqlalchemy.exc import IntegrityError  # noqa: PLC0415

    text = str(getattr(error, "orig", error)).lower()
    return isinstance(error, IntegrityError) or "already exists" in text or "duplicate" in text


def close_catalog(catalog: Any) -> None:
    """Close the catalog's database connections (a SQL catalog's pool)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()
