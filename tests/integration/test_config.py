"""Config validation: every kind of error is reported with its path, all in one pass."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from logrouter.config.load import ConfigError, load_file, load_string
from repo_paths import DOCS

GOOD = """
[spool]
path = "var/spool"

[sources.forward]
type = "fluent_forward"
listen = "tcp:24224:interface=127.0.0.1"

[filters.app]
type = "match"
inputs = ["forward"]
tag = "app.**"

[sinks.lake]
type = "parquet"
inputs = ["app"]
path = "var/lake"
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_string(textwrap.dedent(text))
    return info.value.errors


def test_good_config_loads_with_defaults():
    config = load_string(GOOD)
    assert config.spool == {
        "path": "var/spool", "durability": "fsync", "segment_bytes": 64 << 20, "max_bytes": 8 << 30, "dedupe_window": 100_000,
    }
    assert config.sources["forward"].options["listen"] == "tcp:24224:interface=127.0.0.1"
    assert config.filters["app"].inputs == ["forward"]
    assert config.sinks["lake"].options["roll_secs"] == 300
    assert [c.name for c in config.downstream("forward")] == ["app"]
    assert [c.name for c in config.downstream("app")] == ["lake"]


def test_unknown_section():
    assert errors_of('[sauce]\nx = 1\n') == ["sauce: unknown section (allowed: router, spool, sources, filters, sinks, compaction)"]


def test_unknown_type_lists_known_types():
    (error,) = errors_of('[sources.x]\ntype = "syslog"\n')
    assert error.startswith("sources.x.type: unknown source type 'syslog' (known: ")
    assert "fluent_forward" in error


def test_missing_type():
    (error,) = errors_of('[sinks.x]\ninputs = []\n')
    assert error.startswith("sinks.x.type: required key is missing (one of: ")


def test_unknown_key_lists_allowed_ones():
    errors = errors_of(GOOD + '\n[sinks.lake2]\ntype = "parquet"\ninputs = ["forward"]\npath = "x"\nroll_byts = 5\n')
    assert errors == [
        "sinks.lake2.roll_byts: unknown key (allowed: columns, compression, flatten, hold_sources_secs, max_queue_bytes, path, "
        "retry_initial_secs, retry_max_secs, roll_bytes, roll_row_groups, roll_secs, row_group_rows, writer_id)"
    ]


def test_wrong_value_types():
    errors = errors_of(
        """
        [spool]
        path = 5
        durability = "maybe"
        [sources.f]
        type = "fluent_forward"
        listen = "tcp:24224:interface=127.0.0.1"
        max_connections = true
        [sinks.lake]
        type = "parquet"
        inputs = "f"
        path = "x"
        roll_bytes = "big"
        roll_secs = 0
        """
    )
    assert errors == [
        "spool.path: must be a string, got integer 5",
        "spool.durability: must be one of 'fsync', 'os', 'none', got 'maybe'",
        "sources.f.max_connections: must be an integer, got boolean True",
        "sinks.lake.inputs: must be an array of component names, got string 'f'",
        "sinks.lake.roll_bytes: must be an integer, got string 'big'",
        "sinks.lake.roll_secs: must be greater than 0, got 0",
    ]


def test_required_key_missing():
    errors = errors_of('[sources.f]\ntype = "fluent_forward"\n[sinks.s]\ntype = "parquet"\ninputs = ["f"]\n')
    assert errors == ["sinks.s.path: required key is missing"]


def test_unknown_input_and_sink_as_input():
    errors = errors_of(
        GOOD
        + '\n[sinks.other]\ntype = "parquet"\ninputs = ["lake", "nope"]\npath = "y"\n'
    )
    assert errors == [
        "sinks.other.inputs[0]: 'lake' is a sink; inputs may name sources or filters (or lake.errors)",
        "sinks.other.inputs[1]: unknown input 'nope' (sources and filters: app, forward)",
    ]


def test_sink_without_inputs():
    errors = errors_of(GOOD + '\n[sinks.idle]\ntype = "parquet"\npath = "y"\n')
    assert errors == ["sinks.idle.inputs: required key is missing (a list of source or filter names)"]
    errors = errors_of(GOOD + '\n[sinks.idle]\ntype = "parquet"\npath = "y"\ninputs = []\n')
    assert errors == ["sinks.idle.inputs: must name at least one source or filter"]


def test_cycle_reported_once_with_its_path():
    errors = errors_of(
        GOOD
        + """
        [filters.a]
        type = "match"
        inputs = ["forward", "c"]
        tag = "**"
        [filters.b]
        type = "match"
        inputs = ["a"]
        tag = "**"
        [filters.c]
        type = "match"
        inputs = ["b"]
        tag = "**"
        """.replace("        ", "")
    )
    assert errors == ["filters.a.inputs: cycle a -> c -> b -> a"]


def test_duplicate_component_names_across_kinds():
    errors = errors_of(GOOD + '\n[sinks.app]\ntype = "parquet"\ninputs = ["forward"]\npath = "z"\n')
    assert errors == ["sinks.app: name already used by filters.app; component names must be unique"]


def test_bad_endpoint_strings():
    errors = errors_of(
        """
        [sources.a]
        type = "fluent_forward"
        listen = "tcp:notaport"
        [sources.b]
        type = "fluent_forward"
        listen = "carrier-pigeon:5"
        [sources.c]
        type = "fluent_forward"
        listen = "ssl:24225:privateKey=/nonexistent/key.pem"
        """
    )
    assert len(errors) == 3
    assert errors[0].startswith("sources.a.listen: bad endpoint 'tcp:notaport': ")
    assert errors[1].startswith("sources.b.listen: bad endpoint 'carrier-pigeon:5': ")
    assert errors[2].startswith("sources.c.listen: bad endpoint 'ssl:24225:privateKey=/nonexistent/key.pem': ")
    assert "No such file" in errors[2]


def test_two_listeners_on_one_endpoint():
    errors = errors_of(
        """
        [sources.a]
        type = "fluent_forward"
        listen = "tcp:24224:interface=127.0.0.1"
        [sources.b]
        type = "fluent_forward"
        listen = "tcp:port=24224:interface=127.0.0.1"
        [sources.c]
        type = "fluent_forward"
        listen = "tcp:24224"
        [sources.d]
        type = "fluent_forward"
        listen = "tcp:24225:interface=127.0.0.1"
        """
    )
    assert errors == [
        "sources.b.listen: 'tcp:port=24224:interface=127.0.0.1' listens on the same tcp port 24224 as sources.a.listen",
        "sources.c.listen: 'tcp:24224' listens on the same tcp port 24224 as sources.a.listen",
        "sources.c.listen: 'tcp:24224' listens on the same tcp port 24224 as sources.b.listen",
    ]


def test_filter_option_checks_are_reported():
    errors = errors_of(GOOD + '\n[filters.g]\ntype = "grep"\ninputs = ["forward"]\nfield = "message"\n')
    assert len(errors) == 1 and errors[0].startswith("filters.g: ")


def test_sources_take_no_inputs():
    errors = errors_of('[sources.f]\ntype = "fluent_forward"\ninputs = ["x"]\n')
    assert errors == ["sources.f.inputs: sources take no inputs"]


def test_all_errors_in_one_pass():
    errors = errors_of(
        """
        [spool]
        durability = 1
        [sources.f]
        type = "fluent_forward"
        listen = "tcp:x"
        [sinks.s]
        type = "parquet"
        inputs = ["g"]
        """
    )
    assert [e.split(":")[0] for e in errors] == ["spool.durability", "sources.f.listen", "sinks.s.path", "sinks.s.inputs[0]"]


def test_unreadable_and_invalid_toml(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_file(str(tmp_path / "missing.toml"))
    assert "cannot read" in info.value.errors[0]
    bad = tmp_path / "bad.toml"
    bad.write_text("[sources\n")
    with pytest.raises(ConfigError) as info:
        load_file(str(bad))
    assert info.value.errors[0].startswith(f"{bad}: not valid TOML: ")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "logrouter", *args], capture_output=True, text=True, timeout=60)


def test_check_config_command(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    result = run_cli("check-config", str(good))
    assert result.returncode == 0, result.stderr
    assert "ok (1 sources, 1 filters, 1 sinks)" in result.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD + "\n[sinks.x]\ntype = 'parquet'\npath = 'p'\ninputs = ['nope']\n")
    result = run_cli("check-config", str(bad))
    assert result.returncode == 1
    assert "sinks.x.inputs[0]: unknown input 'nope'" in result.stderr


def test_shipped_default_config_is_valid():
    load_file("etc/logrouter.toml")


def test_source_durability_overrides_the_spool():
    config = load_string(GOOD.replace('listen = "tcp:24224:interface=127.0.0.1"', 'listen = "tcp:24224:interface=127.0.0.1"\ndurability = "os"'))
    assert config.sources["forward"].options["durability"] == "os"
    assert load_string(GOOD).sources["forward"].options["durability"] == ""
    errors = errors_of(GOOD.replace('listen = "tcp:24224:interface=127.0.0.1"', 'listen = "tcp:24224:interface=127.0.0.1"\ndurability = "maybe"'))
    assert errors == ["sources.forward.durability: must be one of '', 'fsync', 'os', 'none', got 'maybe'"]


def test_ports_outside_the_tcp_range_and_unknown_codecs_are_config_errors():
    text = textwrap.dedent(
        """
        [sources.a]
        type = "fluent_forward"
        listen = "tcp:99999"
        [sources.b]
        type = "lumberjack"
        listen = "tcp:-1:interface=127.0.0.1"
        [sinks.lake]
        type = "parquet"
        inputs = ["a", "b"]
        path = "lake"
        compression = "lz77"
        """
    )
    assert errors_of(text) == [
        "sources.a.listen: bad endpoint 'tcp:99999': port 99999 is outside 0..65535",
        "sources.b.listen: bad endpoint 'tcp:-1:interface=127.0.0.1': port -1 is outside 0..65535",
        "sinks.lake.compression: unknown Parquet codec 'lz77' (one of: zstd, snappy, gzip, brotli, lz4, none)",
    ]


def test_cross_key_problems_are_reported_with_the_per_key_ones():
    text = textwrap.dedent(
        """
        [sources.f]
        type = "fluent_forward"
        listen = "tcp:0"
        [sinks.o]
        type = "fluent_forward"
        inputs = ["f"]
        servers = [{host = "a", port = 99999}]
        password = "x"
        """
    )
    assert errors_of(text) == [
        "sinks.o.servers[0].port: must be an integer from 1 to 65535, got integer 99999",
        "sinks.o.username: user authentication is part of the handshake; set shared_key too",
    ]


def test_the_docs_show_what_check_config_prints(tmp_path):
    """The refused-config example of docs/configuration.md is what `logrouter check-config` prints."""
    page = (DOCS / "configuration.md").read_text()
    start = page.index("```\nlogrouter: bad.toml: invalid config")
    shown = page[start + 4 : page.index("```", start + 4)]
    (tmp_path / "bad.toml").write_text(
        textwrap.dedent(
            """
            [sources.f]
            type = "fluent_forward"
            listen = "tcp:nope"
            [sinks.lake]
            type = "parquet"
            inputs = ["f"]
            path = "x"
            roll_bytes = "big"
            [sinks.s]
            type = "parquet"
            inputs = ["g"]
            path = "y"
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "logrouter", "check-config", "bad.toml"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr == shown


def test_warnings_for_what_nothing_takes_and_an_empty_graph(tmp_path):
    from logrouter.config.load import warnings

    config = load_string(
        '[sources.f]\ntype = "fluent_forward"\nlisten = "tcp:0"\n[sources.g]\ntype = "lumberjack"\nlisten = "tcp:0"\n'
        '[filters.m]\ntype = "match"\ninputs = ["f"]\ntag = "x"\n'
        '[sinks.l]\ntype = "parquet"\ninputs = ["f", "g.errors"]\npath = "x"\n'
    )
    assert warnings(config) == [
        "sources.g: nothing takes its events (no filter or sink lists it in inputs)",
        "filters.m: nothing takes its events (no filter or sink lists it in inputs)",
    ]
    assert warnings(load_string("")) == [
        "the config defines no sources and no sinks: the router would take nothing in and write nothing"
    ]
    (tmp_path / "w.toml").write_text('[sources.f]\ntype = "fluent_forward"\nlisten = "tcp:0"\n')
    result = subprocess.run(
        [sys.executable, "-m", "logrouter", "check-config", "w.toml"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0
    assert "logrouter: w.toml: warning: sinks: none defined" in result.stderr
