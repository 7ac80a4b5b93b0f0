"""The ``route`` filter over whole batches, its config errors, and its outputs in a config."""

from __future__ import annotations

import pytest

from logrouter.batch import Batch
from logrouter.config.load import ConfigError, load_string
from logrouter.filters.route import RouteFilter


def make(routes: dict, first_match: bool = False) -> RouteFilter:
    return RouteFilter("r", {"routes": routes, "first_match": first_match}, errors=lambda *a: None)


EVENTS = [
    (1, {"level": "error", "ms": 5}),
    (2, {"level": "info", "ms": 2000}),
    (3, {"level": "error", "ms": 3000}),
    (4, {"level": "debug"}),
    (5, {"nested": {"level": "error"}}),
]


def test_every_matching_route_and_unmatched() -> None:
    out = make({"errors": 'level == "error"', "slow": "ms > 1000"}).process(Batch("t", EVENTS, "s"))
    assert [t for t, _ in out["errors"].events] == [1, 3]
    assert [t for t, _ in out["slow"].events] == [2, 3]
    assert [t for t, _ in out["_unmatched"].events] == [4, 5]
    assert all(b.tag == "t" and b.source == "s" for b in out.values())


def test_first_match_and_nested_fields() -> None:
    out = make({"errors": 'level == "error" or $.nested.level == "error"', "slow": "ms > 1000"}, first_match=True).process(
        Batch("t", EVENTS)
    )
    assert [t for t, _ in out["errors"].events] == [1, 3, 5]
    assert [t for t, _ in out["slow"].events] == [2]
    assert [t for t, _ in out["_unmatched"].events] == [4]


def test_empty_outputs_are_left_out() -> None:
    out = make({"errors": 'level == "error"'}).process(Batch("t", EVENTS[:1]))
    assert list(out) == ["errors"]


def errors_of(routes: str, inputs: str = '["r.errors_only"]') -> list[str]:
    text = (
        '[sources.in]\ntype = "fluent_forward"\nlisten = "tcp:0"\n'
        f'[filters.r]\ntype = "route"\ninputs = ["in"]\nroutes = {routes}\n'
        f'[sinks.s]\ntype = "parquet"\npath = "x"\ninputs = {inputs}\n'
    )
    with pytest.raises(ConfigError) as e:
        load_string(text)
    return e.value.errors


def test_config_errors_name_the_route() -> None:
    assert errors_of('{ errors_only = "level ==" }')[0].startswith("filters.r.routes.errors_only: column")
    assert errors_of('{ "a.b" = "x == 1", _unmatched = "x == 2" }', '["r._unmatched"]') == [
        "filters.r.routes.a.b: a route name is letters, digits, '_' and '-' (it is written as <filter>.a.b)",
        "filters.r.routes._unmatched: '_unmatched' is a reserved output name",
    ]
    assert errors_of('{ errors_only = "x == 1" }', '["r"]') == [
        "sinks.s.inputs[0]: 'r' has named outputs: take one of r.errors_only, r._unmatched"
    ]
