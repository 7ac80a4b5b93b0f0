"""The lake as an Iceberg table: its schema, its partitioning, and where the writer's files go.

Owns the mapping between the lake writer's files (``writer.py``: one file per tag and hour,
columns by ``schema.py``'s rules) and an Iceberg table (format version 2):

* the table's columns are ``time`` (timestamptz), the data columns, ``_extra`` and ``tag``
  (strings); data columns are optional ``boolean``, ``long``, ``double``, ``string`` or
  ``binary``, the lake's five column types;
* ``partition_by`` (hidden partitioning) may use ``year``/``month``/``day``/``hour`` of
  ``time`` and ``identity``/``bucket[N]``/``truncate[W]`` of ``tag``: a file holds one tag
  and one hour, so its partition value is known without reading it;
* ``IcebergLayout`` is the writer's layout: a new file's columns get the table's field ids
  (written into the Parquet schema) and the table's types, and a field the table does not
  have yet is added to it as an optional column (schema evolution by name) *before* the
  file is written. The table's type wins over this writer's (another writer added the
  column first): values that do not fit it go to ``_extra``, as any type conflict does; a
  name equal to a table column but for case goes to ``_extra`` too. Files are written with
  a ``tag`` column and land under ``<table location>/data/<partition path>/``.

Blocking calls (catalog commits): the sink calls this from its worker thread.
"""

from __future__ import annotations

import posixpath
from typing import Any, Sequence

import pyarrow as pa

from logrouter.lake.extra import valid_text
from logrouter.lake.iceberg_catalog import ensure_namespace
from logrouter.lake.iceberg_partition import TAG, parse_partition
from logrouter.lake.partition import HOUR_NS
from logrouter.lake.schema import BINARY, BOOL, EXTRA, FLOAT64, INT64, STRING, TIME, TIME_TYPE, ColumnTypes
from logrouter.lake.writer import FileShape, SealedFile

FIELD_ID = b"PARQUET:field_id"
FORMAT_VERSION = "2"
SCHEMA_ATTEMPTS = 10  # schema updates lost to another writer's: refresh and try again

_CODECS = {"none": "uncompressed"}  # Iceberg's name of a Parquet codec, where it differs


def _iceberg_types() -> dict[pa.DataType, Any]:
    from pyiceberg import types as t  # noqa: PLC0415 - pyiceberg loads only where a table is used

    return {BOOL: t.BooleanType(), INT64: t.LongType(), FLOAT64: t.DoubleType(), STRING: t.StringType(),
            BINARY: t.BinaryType(), TIME_TYPE: t.TimestamptzType()}


def arrow_type(iceberg_type: Any) -> pa.DataType | None:
    """The lake column type of an Iceberg type, or None if the lake has no such column type."""
    for arrow, iceberg in _iceberg_types().items():
        if iceberg == iceberg_type:
            return arrow
    return None


# -- partition_by ------------------------------------------------------------------------


def _transform(kind: str, number: int | None) -> Any:
    from pyiceberg import transforms as t  # noqa: PLC0415

    classes = {"year": t.YearTransform, "month": t.MonthTransform, "day": t.DayTransform, "hour": t.HourTransform,
               "identity": t.IdentityTransform}
    if kind == "bucket":
        return t.BucketTransform(num_buckets=number)
    if kind == "truncate":
        return t.TruncateTransform(width=number)
    return classes[kind]()


def _field_name(kind: str, source: str) -> str:
    return source if kind == "identity" else f"{source}_{'trunc' if kind == 'truncate' else kind}"


# -- creating and loading the table ----------------------------------------------------


def new_schema(column_types: ColumnTypes) -> Any:
    """``time``, the declared columns, ``_extra``, ``tag``: a new table's schema."""
    from pyiceberg.schema import Schema  # noqa: PLC0415
    from pyiceberg.types import NestedField  # noqa: PLC0415

    types = _iceberg_types()
    columns = [(TIME, TIME_TYPE)] + [(n, column_types.get(n)) for n in column_types.declared] + [(EXTRA, STRING), (TAG, STRING)]
    return Schema(*(NestedField(i, name, types[t], required=False) for i, (name, t) in enumerate(columns, 1)))


def new_spec(schema: Any, partition_by: Sequence[str]) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec  # noqa: PLC0415

    fields = []
    for i, text in enumerate(partition_by):
        kind, number, source = parse_partition(text)
        fields.append(PartitionField(schema.find_field(source).field_id, 1000 + i, _transform(kind, number), _field_name(kind, source)))
    return PartitionSpec(*fields)


def load_or_create(catalog: Any, identifier: tuple[str, ...], column_types: ColumnTypes, partition_by: Sequence[str],
                   compression: str) -> tuple[Any, bool]:
    """The table (created if absent: by whichever writer gets there first); True if created here."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError  # noqa: PLC0415

    try:
        return catalog.load_table(identifier), False
    except NoSuchTableError:
        pass
    ensure_namespace(catalog, identifier[:-1])
    schema = new_schema(column_types)
    properties = {
        "format-version": FORMAT_VERSION,
        "write.parquet.compression-codec": _CODECS.get(compression.lower(), compression.lower()),
        # One metadata file per commit: keep the last 100, not all of them.
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "100",
    }
    try:
        return catalog.create_table(identifier, schema, partition_spec=new_spec(schema, partition_by), properties=properties), True
    except TableAlreadyExistsError:
        return catalog.load_table(identifier), False


def spec_text(table: Any) -> list[str]:
    """The table's partitioning in ``partition_by``'s spelling."""
    schema = table.schema()
    out = []
    for field in table.spec().fields:
        name = schema.find_column_name(field.source_id)
        transform = str(field.transform)  # day, identity, bucket[16], truncate[4]
        kind, _, number = transform.partition("[")
        out.append(f"{kind}({number.rstrip(']') + ', ' if number else ''}{name})")
    return out


def check_writable(table: Any) -> None:
    """Raise ValueError if the table cannot take the writer's files (checked at start)."""
    schema = table.schema()
    problems = []
    if not any(f.name == TIME for f in schema.fields):
        problems.append(f"it has no {TIME!r} column")
    for name, wanted in ((TIME, TIME_TYPE), (EXTRA, STRING), (TAG, STRING)):
        field = next((f for f in schema.fields if f.name == name), None)
        if field is not None and arrow_type(field.field_type) != wanted:
            problems.append(f"its column {name!r} is {field.field_type}, the sink writes {_iceberg_types()[wanted]}")
    for text in spec_text(table):
        try:
            parse_partition(text)
        except ValueError as e:
            problems.append(f"it is partitioned by {text}: {e}")
    if problems:
        raise ValueError(f"table {table.name()} cannot take this sink's files: {'; '.join(problems)}")


# -- the writer's layout -----------------------------------------------------------------


class IcebergLayout:
    """Where the lake writer's files go in the table, and the table's schema they are written in.

    ``root`` is the table location's path in the writer's filesystem, ``url_prefix`` what
    turns such a path back into the URL the table records (``file://``, ``hdfs://nn:8020``).
    """

    keeps_table_schema = False

    def __init__(self, table: Any, column_types: ColumnTypes, root: str, url_prefix: str, log: Any = None) -> None:
        self.table = table
        self.column_types = column_types
        self.root = root
        self.url_prefix = url_prefix
        self.log = log
        self.schema_updates = 0
        self.spec = table.spec()
        self._partitions: dict[tuple[str, int], tuple[Any, str]] = {}
        self.ensure_columns([(EXTRA, STRING), (TAG, STRING)])
        self.adopt()

    def adopt(self) -> None:
        """The table's types win: take them for every column the table has."""
        for field in self.table.schema().fields:
            if field.name in (TIME, EXTRA, TAG):
                continue
            wanted = arrow_type(field.field_type)
            if wanted is None or self.column_types.get(field.name) != wanted:
                if field.name in self.column_types or wanted is None:
                    self.column_types.replace(field.name, wanted)
                else:
                    self.column_types.restore([(field.name, _type_name(wanted))])

    # -- paths and partitions --------------------------------------------------------

    def url(self, path: str) -> str:
        return self.url_prefix + path

    def partition(self, tag: str, bucket: int) -> tuple[Any, str]:
        """The partition record of a file of ``tag`` and hour ``bucket``, and its path."""
        key = (tag, bucket)
        found = self._partitions.get(key)
        if found is None:
            from pyiceberg.typedef import Record  # noqa: PLC0415

            schema = self.table.schema()
            micros = bucket * (HOUR_NS // 1000)
            values = []
            for field in self.spec.fields:
                source = schema.find_field(field.source_id)
                value = micros if source.name == TIME else valid_text(tag)
                values.append(field.transform.transform(source.field_type)(value))
            record = Record(*values)
            if len(self._partitions) > 10_000:
                self._partitions.clear()
            found = self._partitions[key] = (record, self.spec.partition_to_path(record, schema))
        return found

    def final_path(self, root: str, tag: str, bucket: int, name: str) -> str:
        path = self.partition(tag, bucket)[1]
        return posixpath.join(self.root, "data", path, name) if path else posixpath.join(self.root, "data", name)

    # -- schemas ----------------------------------------------------------------------

    def file_shape(self, tag: str, bucket: int, schema: pa.Schema) -> FileShape:
        wanted = [(f.name, f.type) for f in schema if f.name not in (TIME, EXTRA)]
        resolved = self.ensure_columns(wanted)
        rows, written = [pa.field(TIME, TIME_TYPE)], [self._field(TIME, TIME_TYPE)]
        for name, _ in wanted:
            column_type = resolved.get(name)
            if column_type is not None:
                rows.append(pa.field(name, column_type))
                written.append(self._field(name, column_type))
        rows.append(pa.field(EXTRA, STRING))
        written += [self._field(EXTRA, STRING), self._field(TAG, STRING)]
        written_schema = pa.schema(written)
        value = pa.scalar(valid_text(tag), STRING)

        def finish(table: pa.Table) -> pa.Table:
            return pa.Table.from_arrays([*table.columns, pa.repeat(value, table.num_rows)], schema=written_schema)

        return FileShape(pa.schema(rows), written_schema, finish)

    def _field(self, name: str, column_type: pa.DataType) -> pa.Field:
        field_id = next(f.field_id for f in self.table.schema().fields if f.name == name)
        return pa.field(name, column_type, metadata={FIELD_ID: str(field_id).encode()})

    def ensure_columns(self, wanted: Sequence[tuple[str, pa.DataType]]) -> dict[str, pa.DataType | None]:
        """The table's type of each wanted column (None: its values go to ``_extra``),
        adding the ones the table lacks; this writer's column types follow the table's."""
        from pyiceberg.exceptions import CommitFailedException  # noqa: PLC0415

        for _ in range(SCHEMA_ATTEMPTS):
            resolved, new = self._resolve(wanted)
            if not new:
                break
            try:
                self._add(new)
            except CommitFailedException:
                self.table.refresh()  # another writer changed the schema first: look again
        else:
            raise RuntimeError(f"table {self.table.name()}: schema updates kept losing to other writers' ({SCHEMA_ATTEMPTS} attempts)")
        for name, column_type in resolved.items():
            if name not in (EXTRA, TAG) and self.column_types.get(name) != column_type:
                self.column_types.replace(name, column_type)
        return resolved

    def _resolve(self, wanted: Sequence[tuple[str, pa.DataType]]) -> tuple[dict[str, pa.DataType | None], list]:
        fields = self.table.schema().fields
        exact = {f.name: f for f in fields}
        folded = {f.name.casefold() for f in fields}
        resolved: dict[str, pa.DataType | None] = {}
        new = []
        for name, column_type in wanted:
            field = exact.get(name)
            if field is not None:
                resolved[name] = arrow_type(field.field_type)
            elif name.casefold() in folded:
                resolved[name] = None  # Spark resolves names case-insensitively: one column per name
            else:
                new.append((name, column_type))
        return resolved, new

    def _add(self, columns: list[tuple[str, pa.DataType]]) -> None:
        types = _iceberg_types()
        names = {f.name for f in self.table.schema().fields}
        with self.table.update_schema() as update:
            for name, column_type in columns:
                update.add_column((name,), types[column_type])
                if EXTRA in names and name not in (EXTRA, TAG):
                    update.move_before((name,), (EXTRA,))  # data columns before _extra and tag
        self.schema_updates += 1
        if self.log is not None:
            self.log.info("iceberg table {table}: added column(s) {columns}", table=".".join(self.table.name()),
                          columns=", ".join(name for name, _ in columns))

    # -- data files -----------------------------------------------------------------

    def data_files(self, sealed: Sequence[SealedFile]) -> list[Any]:
        """The table's ``DataFile`` entries of sealed files (statistics from their footers)."""
        from pyiceberg.io.pyarrow import compute_statistics_plan, data_file_statistics_from_parquet_metadata  # noqa: PLC0415
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat  # noqa: PLC0415

        plan = compute_statistics_plan(self.table.schema(), self.table.metadata.properties)
        out = []
        for file in sealed:
            ids = {f.name: int(f.metadata[FIELD_ID]) for f in file.footer.schema.to_arrow_schema()}
            statistics = data_file_statistics_from_parquet_metadata(file.footer, plan, ids)
            out.append(DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=self.url(file.final_path),
                file_format=FileFormat.PARQUET,
                partition=self.partition(file.tag, file.hour_bucket)[0],
                file_size_in_bytes=file.bytes,
                sort_order_id=None,
                spec_id=self.spec.spec_id,
                equality_ids=None,
                key_metadata=None,
                **statistics.to_serialized_dict(),
            ))
        return out


def _type_name(column_type: pa.DataType) -> str:
    return {BOOL: "bool", INT64: "int", FLOAT64: "float", STRING: "string", BINARY: "binary"}[column_type]
