"""The Log Courier guide (``docs/guides/log-courier.md``) run as written: its snippets
against the real Log Courier 2.12.0 shipper and the real daemon on loopback.

Each test reads its snippets from the page by name (``tests/doc_snippets.py``), changes
only what a test machine needs changed (the router's port and interface, the lake's, the
persist directory's and the log's paths, the certificate files, which are
``fixtures.pki``'s), runs the shipper with the command the page gives (checked against the
argv ``tests/log_courier_shipper.py`` runs), and reads the lake back: every line once. A
test adds to the router's config only a metrics endpoint on loopback. Skipped, saying why,
where the shipper cannot be built.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from daemon import Daemon
from doc_snippets import snippet, substituted, toml_tables
from helpers import read_lake, wait_until
from log_courier_shipper import FINISHED, Shipper, ensure_built_with_reason

pytestmark = pytest.mark.timeout(600)  # the first test may build the shipper (480 s budget)

PAGE = "docs/guides/log-courier.md"
LOOPBACK = "tcp:0:interface=127.0.0.1"
METRICS = '\n[router]\nmetrics_listen = "tcp:0:interface=127.0.0.1"\n'
CONFIG_FILE = "/etc/log-courier/log-courier.json"
SHIP_SECS = 60  # bounds on a busy machine; a warm run takes a few seconds


@pytest.fixture(scope="module")
def shipper_binary() -> Path:
    binary, reason = ensure_built_with_reason()
    if binary is None:
        pytest.skip(f"the Log Courier shipper is not available: {reason}")
    return binary


def line(n: int) -> str:
    return f"courier guide line {n:05d}"


def router_config(lake: Path, source: str | None = None) -> str:
    """The page's router config on loopback into ``lake``; ``source``, if given, replaces
    its ``[sources.courier]`` table (the TLS snippet gives only that table)."""
    text = substituted(snippet(PAGE, "courier-router"), {
        'listen = "tcp:5043"': f'listen = "{LOOPBACK}"',
        '"/var/lib/logrouter/lake"': json.dumps(str(lake)),
    })
    if source is not None:
        tables = toml_tables(text)
        tables["sources.courier"] = source + "\n"
        text = "".join(tables.values())
    return text + METRICS


def fragment(name: str, replacements: dict[str, str] | None = None) -> dict:
    """A snippet that is one key of the shipper's JSON config (``"files": [...]``)."""
    return json.loads("{" + substituted(snippet(PAGE, name), replacements or {}) + "}")


def shipper_config(workdir: Path, port: int, **sections: object) -> dict:
    """The page's shipper config, persisting under ``workdir``, sending to ``port`` on
    loopback; ``sections`` replace or add top-level sections (another snippet's)."""
    config = json.loads(substituted(snippet(PAGE, "log-courier"), {
        '"/var/lib/log-courier"': json.dumps(str(workdir / "persist")),
        '"router.example:5043"': f'"127.0.0.1:{port}"',
    }))
    for key, value in sections.items():
        config[key] = value
    return config


def files_shipper(binary: Path, workdir: Path, config: dict) -> Shipper:
    """A ``Shipper`` following files with ``config``, run with the page's command: its
    arguments must be the ones ``Shipper`` runs with files (``-from-beginning``)."""
    shipper = Shipper(binary, 0, workdir=workdir, files=config["files"])
    shipper.config = config
    shipper.config_path.write_text(json.dumps(config, indent=2) + "\n")
    argv = shlex.split(substituted(snippet(PAGE, "log-courier-files-command"), {CONFIG_FILE: str(shipper.config_path)}))
    assert argv[0] == "log-courier" and argv[1:] == shipper.argv[1:], (argv, shipper.argv)
    return shipper


def ship_stdin(binary: Path, workdir: Path, config: dict, count: int) -> str:
    """The page's ``-stdin`` command run by ``bash`` as written (``app.log`` holding
    ``count`` lines), in its own session; once the shipper logs that its input ended and
    everything is acknowledged (2.12.0 then waits for a signal) the session gets SIGTERM.
    Its output."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "app.log").write_text("".join(f"{line(n)}\n" for n in range(count)))
    config_path = workdir / "log-courier.json"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    command = substituted(snippet(PAGE, "log-courier-stdin-command"), {
        "log-courier -config": f"{binary} -config",
        CONFIG_FILE: str(config_path),
    })
    output = workdir / "output.log"
    with output.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", command], cwd=workdir, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: FINISHED in output.read_text(errors="replace") or proc.poll() is not None, SHIP_SECS,
                   "the shipper to finish")
        assert proc.poll() is None, f"it exited {proc.returncode} by itself"
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(SHIP_SECS) in (0, -signal.SIGTERM)  # bash may die of it before its pipeline ends
    except BaseException:
        print(output.read_text(errors="replace")[-4000:])
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(SHIP_SECS)
    return output.read_text(errors="replace")


def metric(daemon: Daemon, name: str) -> float:
    """A counter summed over its labels."""
    return sum(v for k, v in daemon.metrics().items() if k == name or k.startswith(name + "{"))


def stored(daemon: Daemon) -> float:
    return metric(daemon, "logrouter_events_in_total")


def assert_each_line_once(rows: list[dict], count: int) -> None:
    counts = collections.Counter(row["message"] for row in rows)
    assert sorted(counts) == [line(n) for n in range(count)] and set(counts.values()) == {1}, (
        f"{len(rows)} rows for {count} lines, {len(counts)} distinct")


def test_log_courier_from_stdin(shipper_binary, tmp_path):
    """Sections "logrouter" and "Log Courier"."""
    with Daemon(tmp_path, router_config(tmp_path / "lake")) as daemon:
        daemon.start()
        config = shipper_config(tmp_path / "shipper", daemon.port("courier"))
        ship_stdin(shipper_binary, tmp_path / "shipper", config, 2000)
        daemon.stop_gracefully()
    rows = read_lake(tmp_path / "lake")
    assert_each_line_once(rows, 2000)
    assert {(row["tag"], row["host"]) for row in rows} == {("courier.stdin", "app-1")}


def test_log_courier_following_files(shipper_binary, tmp_path):
    """Section "Log Courier", the ``files`` variant: lines already in the files when it
    first starts, and lines appended while it follows them."""
    logs = tmp_path / "logs"
    logs.mkdir()
    files = [logs / "web.log", logs / "worker.log"]
    for k, path in enumerate(files):
        path.write_text("".join(f"{line(n)}\n" for n in range(k, 1200, 2)))
    files_section = fragment("log-courier-files", {'"/var/log/app/*.log"': json.dumps(str(logs / "*.log"))})
    with Daemon(tmp_path, router_config(tmp_path / "lake")) as daemon:
        daemon.start()
        config = shipper_config(tmp_path / "shipper", daemon.port("courier"), **files_section)
        del config["stdin"]  # "replace "stdin" with a "files" list"
        shipper = files_shipper(shipper_binary, tmp_path / "shipper", config)
        try:
            shipper.start()
            wait_until(lambda: stored(daemon) >= 1200, SHIP_SECS, "the lines already in the files")
            for k, path in enumerate(files):
                with path.open("a") as f:
                    f.write("".join(f"{line(n)}\n" for n in range(1200 + k, 2000, 2)))
            wait_until(lambda: stored(daemon) >= 2000, SHIP_SECS, "the lines appended")
        except BaseException:
            print(shipper.output()[-4000:])
            raise
        finally:
            shipper.stop()
        daemon.stop_gracefully()
    rows = read_lake(tmp_path / "lake")
    assert_each_line_once(rows, 2000)
    assert {row["tag"] for row in rows} == {"courier.app"}
    assert {row["path"] for row in rows} == {str(path) for path in files}


def test_log_courier_over_tls_with_a_client_certificate(shipper_binary, tmp_path, pki):
    """Section "With TLS and a client certificate"."""
    source = substituted(snippet(PAGE, "courier-router-tls"), {
        "ssl:5043:": "ssl:0:",
        "/etc/logrouter/server.key": str(pki.server_key),
        "/etc/logrouter/server.pem": f"{pki.server_cert}:interface=127.0.0.1",
        "/etc/logrouter/ca.pem": str(pki.ca),
    })
    with Daemon(tmp_path, router_config(tmp_path / "lake", source)) as daemon:
        daemon.start()
        port = daemon.port("courier")
        network = fragment("log-courier-tls", {
            '"router.example:5043"': f'"127.0.0.1:{port}"',
            "/etc/log-courier/ca.pem": str(pki.ca),
            "/etc/log-courier/client.pem": str(pki.client_cert),
            "/etc/log-courier/client.key": str(pki.client_key),
        })
        config = shipper_config(tmp_path / "shipper", port, **network)
        ship_stdin(shipper_binary, tmp_path / "shipper", config, 2000)
        assert metric(daemon, "logrouter_source_tls_errors_total") == 0
        daemon.stop_gracefully()
    assert_each_line_once(read_lake(tmp_path / "lake"), 2000)
