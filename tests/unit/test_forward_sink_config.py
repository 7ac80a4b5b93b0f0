"""Config validation of the ``fluent_forward`` sink: defaults, ``servers`` shapes and the
TLS/handshake combinations, every problem reported with its path in one pass."""

from __future__ import annotations

import textwrap

import pytest

from logrouter.config.load import ConfigError, load_string

HEAD = """
[sources.f]
type = "fluent_forward"
listen = "tcp:0"

[sinks.out]
type = "fluent_forward"
inputs = ["f"]
"""


def load(body: str):
    return load_string(HEAD + textwrap.dedent(body))


def errors_of(body: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(body)
    return info.value.errors


def test_defaults():
    options = load('servers = [{ host = "10.0.0.1" }]').sinks["out"].options
    assert options["servers"] == [{"host": "10.0.0.1"}]
    assert options["require_ack_response"] is True
    assert options["ack_response_timeout_secs"] == 60
    assert options["compress"] == "text"
    assert options["heartbeat_type"] == "tcp" and options["heartbeat_interval_secs"] == 1
    assert options["tls"] is False and options["verify_hostname"] is True
    assert options["max_in_flight_bytes"] == 8 << 20 and options["max_chunk_bytes"] == 1 << 20


def test_several_servers_with_weights_and_standby():
    config = load(
        """
        servers = [
          { host = "a.example", port = 24224, weight = 60 },
          { host = "b.example", port = 24225, weight = 20 },
          { host = "c.example", standby = true },
        ]
        """
    )
    from logrouter.sinks.fluent_forward import FluentForwardSink

    sink = FluentForwardSink("out", config.sinks["out"].options, None, None)
    assert [(s.label, s.weight, s.standby) for s in sink.servers] == [
        ("a.example:24224", 60, False),
        ("b.example:24225", 20, False),
        ("c.example:24224", 60, True),
    ]


def test_server_problems_named_by_index():
    errors = errors_of(
        """
        servers = [
          { host = "a", port = "x" },
          { port = 70000, weight = 0, standby = "no" },
          { host = "a", port = 24224, wieght = 3 },
          "b:24224",
          { host = "a", port = 24224 },
        ]
        """
    )
    assert errors == [
        "sinks.out.servers[0].port: must be an integer from 1 to 65535, got string 'x'",
        "sinks.out.servers[1].host: required key is missing",
        "sinks.out.servers[1].port: must be an integer from 1 to 65535, got integer 70000",
        "sinks.out.servers[1].weight: must be an integer of 1 or more, got integer 0",
        "sinks.out.servers[1].standby: must be a boolean, got string 'no'",
        "sinks.out.servers[2].wieght: unknown key (allowed: host, port, standby, weight)",
        "sinks.out.servers[3]: must be a table { host = …, port = …, weight = …, standby = … }, got string 'b:24224'",
        "sinks.out.servers[4]: a:24224 is already listed as [2]",
    ]


@pytest.mark.parametrize(
    "body, message",
    [
        ("", "sinks.out.servers: required key is missing"),
        ("servers = []", "sinks.out.servers: must list at least one server"),
        ('servers = [{ host = "a", standby = true }]', "every server is a standby"),
        ('servers = "a:1"', "sinks.out.servers: must be an array"),
        ('servers = [{ host = "" }]', "[0].host: must be a host name or IP address"),
    ],
)
def test_servers_required_and_shaped(body, message):
    assert any(message in e for e in errors_of(body)), errors_of(body)


def test_option_values_checked():
    errors = errors_of(
        """
        servers = [{ host = "a" }]
        compress = "zstd"
        heartbeat_type = "icmp"
        ack_response_timeout_secs = 0
        compress_level = 12
        max_in_flight_bytes = -1
        """
    )
    assert any(e.startswith("sinks.out.compress: must be one of 'text', 'gzip'") for e in errors), errors
    assert any(e.startswith("sinks.out.heartbeat_type: must be one of 'tcp', 'udp', 'none'") for e in errors)
    assert any(e.startswith("sinks.out.ack_response_timeout_secs: must be greater than 0") for e in errors)
    assert any(e.startswith("sinks.out.compress_level: must be one of") for e in errors)
    assert any(e.startswith("sinks.out.max_in_flight_bytes: must be greater than 0") for e in errors)


def test_tls_files_and_combinations(pki, tmp_path):
    good = load(
        f"""
        servers = [{{ host = "localhost" }}]
        tls = true
        ca_file = '{pki.ca}'
        client_cert = '{pki.client_cert}'
        client_key = '{pki.client_key}'
        shared_key = "k"
        username = "u"
        password = "p"
        """
    )
    assert good.sinks["out"].options["tls"] is True
    errors = errors_of(f"servers = [{{ host = \"a\" }}]\nca_file = '{pki.ca}'\nclient_cert = '{pki.client_cert}'\n")
    assert "sinks.out.ca_file: only used with tls = true; set tls = true or remove ca_file" in errors
    assert "sinks.out.client_cert: only used with tls = true; set tls = true or remove client_cert" in errors
    assert "sinks.out: client_cert, client_key: give both (client certificate) or neither" in errors
    missing = tmp_path / "missing.pem"
    errors = errors_of(f"servers = [{{ host = \"a\" }}]\ntls = true\nca_file = '{missing}'\n")
    assert errors[0].startswith("sinks.out.ca_file: cannot read"), errors
    errors = errors_of(
        f"servers = [{{ host = \"a\" }}]\ntls = true\nclient_cert = '{pki.client_cert}'\nclient_key = '{pki.server_key}'\n"
    )
    assert errors[0].startswith("sinks.out.client_cert: cannot be loaded with client_key"), errors


def test_user_needs_shared_key():
    errors = errors_of('servers = [{ host = "a" }]\nusername = "u"\npassword = "p"\n')
    assert errors == ["sinks.out.username: user authentication is part of the handshake; set shared_key too"]
    errors = errors_of('servers = [{ host = "a" }]\nshared_key = "k"\npassword = "p"\n')
    assert errors == ["sinks.out.password: set username too"]
