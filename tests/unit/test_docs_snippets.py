"""Every TOML snippet in the docs site and the README is a config logrouter accepts.

Each ```toml block under ``docs/`` and in ``README.md`` is parsed and validated as
``check-config`` would. A snippet shows one part of a config, so what it leaves out is
filled in first: an input it
names but does not define becomes a stub ``fluent_forward`` source, so the snippet's own
keys, types and graph are what is checked. The TLS files the snippets name
(``/etc/logrouter/server.key`` and the like) are replaced by a throwaway PKI's, so their
``ssl:`` endpoints and certificate options are checked with real files too. Snippets of a
shipper's own config (Filebeat's YAML, fluentd's ``<match>``) are not TOML blocks and are
not checked here (the guides' tests run some of those: ``tests/doc_snippets.py``).
"""

from __future__ import annotations

import tomllib

import pytest

from doc_snippets import blocks
from logrouter.config.load import ConfigError, validate
from repo_paths import DOCS, REPO

#: The TLS files the snippets name -> the attribute of ``fixtures.pki.Pki`` that stands in.
TLS_FILES = {
    "/etc/logrouter/server.key": "server_key",
    "/etc/logrouter/server.pem": "server_cert",
    "/etc/logrouter/ca.pem": "ca",
    "/etc/logrouter/client.pem": "client_cert",
    "/etc/logrouter/client.key": "client_key",
}


def snippets() -> list[tuple[str, str]]:
    found = []
    for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for n, text in enumerate(blocks(page, "toml"), 1):
            found.append((f"{page.relative_to(REPO)}#{n}", text))
    return found


def completed(raw: dict) -> dict:
    """``raw`` with a stub source for every input it names and does not define, and a
    parquet sink for a ``[compaction]`` to compact."""
    defined = {name for kind in ("sources", "filters") for name in raw.get(kind, {})}
    port = 40000
    for kind in ("filters", "sinks"):
        for table in raw.get(kind, {}).values():
            for reference in table.get("inputs", []):
                base = reference.split(".", 1)[0]
                if base not in defined:
                    port += 1
                    raw.setdefault("sources", {})[base] = {"type": "fluent_forward", "listen": f"tcp:{port}:interface=127.0.0.1"}
                    defined.add(base)
    if raw.get("compaction", {}).get("enabled") and not any(t.get("type") == "parquet" for t in raw.get("sinks", {}).values()):
        raw.setdefault("sources", {}).setdefault("_in", {"type": "fluent_forward", "listen": "tcp:39999:interface=127.0.0.1"})
        raw.setdefault("sinks", {})["_lake"] = {"type": "parquet", "inputs": ["_in"], "path": "var/lake"}
    return raw


@pytest.mark.parametrize(("where", "text"), snippets(), ids=[where for where, _ in snippets()])
def test_a_toml_snippet_is_a_valid_config(where, text, pki):
    for path, attribute in TLS_FILES.items():
        text = text.replace(path, str(getattr(pki, attribute)))
    raw = tomllib.loads(text)
    try:
        validate(completed(raw))
    except ConfigError as e:
        pytest.fail(f"{where}: the snippet is refused:\n  " + "\n  ".join(e.errors))


def test_the_docs_have_snippets():
    assert len(snippets()) >= 20
