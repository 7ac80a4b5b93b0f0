"""``flatten = true``: nested tables become dotted typed columns, arrays stay in ``_extra``."""

from __future__ import annotations

import pyarrow.parquet as pq

from logrouter.lake.flatten import MAX_DEPTH, flatten_events, flatten_record
from test_parquet_sink_commit import lake_ids, make_sink, record, tick  # noqa: F401 - helpers


def test_tables_become_dotted_names_and_the_rest_stays() -> None:
    record_in = {"host": {"name": "a", "ip": {"v4": "10.0.0.1"}}, "tags": ["x"], "empty": {}, "n": 1}
    copy = {"host": {"name": "a", "ip": {"v4": "10.0.0.1"}}, "tags": ["x"], "empty": {}, "n": 1}
    assert flatten_record(record_in) == {"host.name": "a", "host.ip.v4": "10.0.0.1", "tags": ["x"], "empty": {}, "n": 1}
    assert record_in == copy  # never changed in place
    flat = {"a": 1}
    assert flatten_record(flat) is flat


def test_a_name_already_used_keeps_the_table_whole() -> None:
    assert flatten_record({"host.name": "top", "host": {"name": "nested"}}) == {"host.name": "top", "host": {"name": "nested"}}


def test_depth_is_bounded() -> None:
    deep: dict = {"leaf": 1}
    for _ in range(MAX_DEPTH + 3):
        deep = {"d": deep}
    flat = flatten_record({"root": deep})
    (name, value), = flat.items()
    assert name.count(".") == MAX_DEPTH and isinstance(value, dict)


def test_events_list_is_kept_when_nothing_is_nested() -> None:
    events = [(1, {"a": 1}), (2, {"b": 2})]
    assert flatten_events(events) is events
    assert flatten_events([(1, {"a": 1}), (2, {"t": {"x": 1}})]) == [(1, {"a": 1}), (2, {"t.x": 1})]


def test_the_parquet_sink_writes_dotted_columns(tmp_path) -> None:
    from logrouter.batch import Batch
    from logrouter.sinks.parquet import _ROWS

    sink = make_sink(tmp_path, flatten=True)
    assert sink._recover() == 0
    events = [(10**18 + i, {"id": i, "http": {"status": 200 + i, "path": "/x"}, "tags": ["a"]}) for i in range(3)]
    sink._run([((_ROWS, Batch("t", events), 0, 100), 0.0, 0, 0)])
    sink._run([tick(400.0, 100)])
    files = [p for p in (tmp_path / "lake").rglob("*.parquet") if "_staging" not in p.parts]
    table = pq.read_table(files[0])
    assert table.column("http.status").to_pylist() == [200, 201, 202]
    assert table.schema.field("http.status").type == "int64"
    assert "http" not in table.column_names and table.column("_extra").to_pylist()[0] == '{"tags":["a"]}'
