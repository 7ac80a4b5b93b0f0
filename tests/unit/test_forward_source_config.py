"""Config validation of the fluent_forward source's security, TLS and heartbeat options."""

from __future__ import annotations

import textwrap

import pytest

from logrouter.config.load import ConfigError, load_string


def source_config(body: str) -> str:
    return '[sources.f]\ntype = "fluent_forward"\n' + textwrap.dedent(body)


def errors_of(body: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_string(source_config(body))
    return info.value.errors


def test_defaults():
    options = load_string(source_config('listen = "tcp:0"\n')).sources["f"].options
    assert options["shared_key"] == "" and options["self_hostname"] == "" and options["users"] == []
    assert options["verify_client"] is False and options["ca_file"] == "" and options["udp_heartbeat"] is True


def test_full_security_and_mutual_tls_config_loads(pki):
    config = load_string(
        source_config(
            f"""
            listen = '{pki.ssl_endpoint()}'
            shared_key = "s3cret"
            self_hostname = "router.test"
            verify_client = true
            ca_file = '{pki.ca}'
            udp_heartbeat = false

            [[sources.f.users]]
            username = "alice"
            password = "pw"

            [[sources.f.users]]
            username = "bob"
            password = ""
            """
        )
    )
    options = config.sources["f"].options
    assert [u["username"] for u in options["users"]] == ["alice", "bob"]
    assert options["verify_client"] is True


def test_missing_and_unusable_ca_file_named_by_key_path(pki, tmp_path):
    missing = tmp_path / "nope.pem"
    (error,) = errors_of(f"listen = '{pki.ssl_endpoint()}'\nverify_client = true\nca_file = '{missing}'\n")
    assert error == f"sources.f.ca_file: cannot read '{missing}': No such file or directory"
    (error,) = errors_of(f"listen = '{pki.ssl_endpoint()}'\nverify_client = true\nca_file = '{pki.server_key}'\n")
    assert error == f"sources.f.ca_file: '{pki.server_key}' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    unreadable = tmp_path / "dir.pem"
    unreadable.mkdir()
    (error,) = errors_of(f"listen = '{pki.ssl_endpoint()}'\nverify_client = true\nca_file = '{unreadable}'\n")
    assert error.startswith(f"sources.f.ca_file: cannot read '{unreadable}': ")


def test_verify_client_needs_ssl_and_a_ca(pki):
    assert errors_of(f"listen = 'tcp:0'\nverify_client = true\nca_file = '{pki.ca}'\n") == [
        "sources.f.verify_client: needs an ssl: listen endpoint, got 'tcp:0'"
    ]
    assert errors_of(f"listen = '{pki.ssl_endpoint()}'\nverify_client = true\n") == [
        "sources.f.ca_file: required when verify_client = true"
    ]
    assert errors_of(f"listen = '{pki.ssl_endpoint()}'\nca_file = '{pki.ca}'\n") == [
        "sources.f.ca_file: only used with ssl_client_authentication 'optional' or 'required' "
        "(or verify_client = true); set it or remove ca_file"
    ]


# -- ssl_client_authentication, the stream sources' shared option, and its alias verify_client --


def test_ssl_client_authentication_is_accepted_as_for_every_stream_source(pki):
    for mode in ("optional", "required"):
        body = f"listen = '{pki.ssl_endpoint()}'\nssl_client_authentication = '{mode}'\nca_file = '{pki.ca}'\n"
        options = load_string(source_config(body)).sources["f"].options
        assert options["ssl_client_authentication"] == mode and options["verify_client"] is False
    assert errors_of(f"listen = 'tcp:0'\nssl_client_authentication = 'required'\nca_file = '{pki.ca}'\n") == [
        "sources.f.ssl_client_authentication: 'required' needs an ssl: listen endpoint, got 'tcp:0'"
    ]
    assert errors_of(f"listen = '{pki.ssl_endpoint()}'\nssl_client_authentication = 'optional'\n") == [
        "sources.f.ca_file: required when ssl_client_authentication is 'optional'"
    ]


def test_verify_client_true_is_ssl_client_authentication_required(pki):
    from logrouter.sources.fluent_forward import FluentForwardSource

    body = f"listen = '{pki.ssl_endpoint()}'\nverify_client = true\nca_file = '{pki.ca}'\n"
    options = load_string(source_config(body)).sources["f"].options
    assert FluentForwardSource.client_authentication(options)[0] == "required"
    # Both keys, agreeing: accepted.
    both = body + "ssl_client_authentication = 'required'\n"
    options = load_string(source_config(both)).sources["f"].options
    assert FluentForwardSource.client_authentication(options)[0] == "required"
    # Neither: no client certificates.
    options = load_string(source_config(f"listen = '{pki.ssl_endpoint()}'\n")).sources["f"].options
    assert FluentForwardSource.client_authentication(options)[0] == "none"


def test_verify_client_contradicting_ssl_client_authentication_is_refused(pki):
    body = f"listen = '{pki.ssl_endpoint()}'\nverify_client = true\nssl_client_authentication = 'optional'\nca_file = '{pki.ca}'\n"
    assert errors_of(body) == [
        "sources.f.verify_client: verify_client = true means ssl_client_authentication = 'required', "
        "which contradicts ssl_client_authentication = 'optional'; set only ssl_client_authentication"
    ]


def test_bad_server_key_reported_on_listen(pki, tmp_path):
    (error,) = errors_of(f"listen = 'ssl:0:privateKey={tmp_path}/missing.key'\nverify_client = true\nca_file = '{pki.ca}'\n")
    assert error.startswith(f"sources.f.listen: bad endpoint 'ssl:0:privateKey={tmp_path}/missing.key'")


@pytest.mark.parametrize(
    "users, message",
    [
        ('users = ["alice"]', "item 0 must be a table {username = …, password = …}"),
        ('users = [{username = "alice"}]', "item 0: password is missing"),
        ('users = [{password = "pw"}]', "item 0: username is missing"),
        ('users = [{username = "alice", password = 5}]', "item 0: password must be a string"),
        ('users = [{username = "", password = "pw"}]', "item 0: username must not be empty"),
        ('users = [{username = "a", password = "pw", role = "x"}]', "item 0: unknown key(s) role (allowed: password, username)"),
        ('users = [{username = "a", password = "1"}, {username = "a", password = "2"}]', "item 1: username 'a' is listed twice"),
        ('users = {username = "a", password = "1"}', "must be an array, got table"),
    ],
)
def test_users_shape(users, message):
    (error,) = errors_of(f'listen = "tcp:0"\nshared_key = "k"\n{users}\n')
    assert error.startswith(f"sources.f.users: {message}")
    assert '"pw"' not in error and "'pw'" not in error  # password values are never echoed


def test_users_need_a_shared_key():
    assert errors_of('listen = "tcp:0"\nusers = [{username = "a", password = "p"}]\n') == [
        "sources.f.users: user authentication is part of the handshake; set shared_key too"
    ]


def test_option_types():
    errors = errors_of('listen = "tcp:0"\nshared_key = 5\nverify_client = "yes"\nudp_heartbeat = 1\n')
    assert errors == [
        "sources.f.shared_key: must be a string, got integer 5",
        "sources.f.verify_client: must be a boolean, got string 'yes'",
        "sources.f.udp_heartbeat: must be a boolean, got integer 1",
    ]
