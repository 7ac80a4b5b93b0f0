"""Several writers opening one new SQL catalog at once: whoever loses a creation race goes on.

pyiceberg's SQL catalog checks, then creates: its own tables (``iceberg_tables``,
``iceberg_namespace_properties``) when it is opened, and a namespace's row in
``create_namespace``. Two processes starting together on an empty catalog (the workers of
one router, several routers) can both see nothing and both create; the database refuses
the second (``table iceberg_tables already exists``, or a UNIQUE constraint), and the
loser's start failed with that error. Each test plays the losing side of that interleaving
deterministically: the other writer creates between this one's check and its create.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyiceberg")

from logrouter.lake.iceberg_catalog import catalog_properties, close_catalog, open_catalog  # noqa: E402
from logrouter.lake.iceberg_table import load_or_create  # noqa: E402
from logrouter.lake.schema import ColumnTypes  # noqa: E402


def properties(tmp_path) -> dict[str, str]:
    return catalog_properties(str(tmp_path / "warehouse"))


def test_a_catalog_whose_tables_another_writer_created_meanwhile_opens(tmp_path, monkeypatch):
    from pyiceberg.catalog.sql import SqlCatalogBaseTable

    create_all = SqlCatalogBaseTable.metadata.create_all
    raced = []

    def another_writer_first(engine, *args, **kwargs):
        if not raced:
            raced.append(1)
            create_all(engine)  # the other writer's creation lands first …
            return create_all(engine, checkfirst=False)  # … after this one had checked: "already exists"
        return create_all(engine, *args, **kwargs)

    monkeypatch.setattr(SqlCatalogBaseTable.metadata, "create_all", another_writer_first)
    catalog = open_catalog("lake", properties(tmp_path))
    try:
        assert raced and catalog.list_namespaces() == []
    finally:
        close_catalog(catalog)


def test_a_namespace_another_writer_created_meanwhile_is_taken(tmp_path, monkeypatch):
    other = open_catalog("lake", properties(tmp_path))
    this = open_catalog("lake", properties(tmp_path))
    try:
        checked = []
        real = type(this).namespace_exists

        def checked_before_the_other_created(self, namespace):
            if self is this and not checked:
                checked.append(1)
                other.create_namespace(namespace)  # lands between this one's check and its insert
                return False
            return real(self, namespace)

        monkeypatch.setattr(type(this), "namespace_exists", checked_before_the_other_created)
        table, created = load_or_create(this, ("logs", "events"), ColumnTypes({}), ["day(time)"], "zstd")
        assert checked and created and table.name() == ("logs", "events")
        assert this.list_namespaces() == [("logs",)]
    finally:
        close_catalog(other)
        close_catalog(this)


def test_a_catalog_that_cannot_be_opened_still_fails_saying_why(tmp_path):
    (tmp_path / "warehouse").mkdir()
    (tmp_path / "warehouse" / "catalog.db").mkdir()  # not a database file
    with pytest.raises(Exception, match="unable to open database file"):
        open_catalog("lake", properties(tmp_path))
