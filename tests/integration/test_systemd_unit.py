"""systemd/logrouter.service and logrouter.socket: ``systemd-analyze verify`` passes with
the paths docs/operations/service.md installs to, ``systemd-analyze security`` rates the sandbox OK, the
hardening the unit promises is there, and the configs the units document are valid.

``systemd-analyze`` (Debian package ``systemd``) works on unit files without a running
systemd; the tests that need it skip, saying so, where it is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import REPO

SYSTEMD = REPO / "systemd"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd)")
PREFIX = "/opt/logrouter/bin/"  # where docs/operations/service.md puts the venv
LOGROUTER = Path(sys.executable).parent / "logrouter"


def settings(unit: Path) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, repeated keys in order."""
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def installed_units(tmp_path: Path) -> Path:
    """The units with the documented venv prefix pointing at this venv, as an install would
    have them (``systemd-analyze verify`` checks that every command is executable)."""
    if Path(PREFIX, "twistd").exists():
        return SYSTEMD  # a real install: verify the unit as shipped
    bindir = str(Path(sys.executable).parent) + "/"
    for name in ("logrouter.service", "logrouter.socket"):
        text = (SYSTEMD / name).read_text()
        (tmp_path / name).write_text(text.replace(PREFIX, bindir))
    return tmp_path


def test_the_commands_use_the_documented_prefix():
    unit = settings(SYSTEMD / "logrouter.service")
    assert unit["ExecStart"] == [f"{PREFIX}twistd --nodaemon --pidfile= logrouter --config /etc/logrouter/logrouter.toml"]
    assert unit["ExecStartPre"] == [f"-+{PREFIX}logrouter plugin-cache"]
    assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # the router reloads on SIGHUP
    assert (Path(sys.executable).parent / "twistd").exists() and LOGROUTER.exists()


@needs_analyze
def test_verify_passes(tmp_path):
    where = installed_units(tmp_path)
    result = subprocess.run(
        [ANALYZE, "verify", str(where / "logrouter.service"), str(where / "logrouter.socket")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result


@needs_analyze
def test_security_rates_the_sandbox_ok(tmp_path):
    where = installed_units(tmp_path)
    result = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--threshold=30", str(where / "logrouter.service")],
        capture_output=True, text=True,
    )
    m = re.search(r"Overall exposure level for logrouter\.service: ([\d.]+) (\w+)", result.stdout)
    assert m, result
    assert float(m.group(1)) <= 3.0 and m.group(2) == "OK", result.stdout
    assert result.returncode == 0, result


def test_the_unit_is_hardened():
    unit = settings(SYSTEMD / "logrouter.service")
    one = {key: values[-1] for key, values in unit.items()}
    assert one["User"] == one["Group"] == "logrouter" and one["StateDirectory"] == "logrouter"
    assert one["WorkingDirectory"] == "/var/lib/logrouter"
    for key, value in {
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "", "AmbientCapabilities": "", "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes", "LockPersonality": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX AF_NETLINK",
    }.items():
        assert one.get(key) == value, key
    assert "@system-service" in unit["SystemCallFilter"]
    # Compaction (PySpark, a Java JIT) is enabled in the config the unit runs: W+X memory
    # must stay allowed.
    assert "compaction]\nenabled = true" in (SYSTEMD / "logrouter.toml").read_text()
    assert "MemoryDenyWriteExecute" not in unit


def test_the_service_config_writes_only_where_the_unit_allows():
    unit = settings(SYSTEMD / "logrouter.service")
    writable = ["/var/lib/logrouter/", "/tmp/"] + [p + "/" for v in unit.get("ReadWritePaths", []) for p in v.split()]
    paths = re.findall(r'^path = "([^"]+)"', (SYSTEMD / "logrouter.toml").read_text(), re.M)
    assert len(paths) == 2
    for path in paths:
        assert any(path.startswith(w) for w in writable), path


def run_check_config(path: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin"}  # no LISTEN_* from the environment
    return subprocess.run([str(LOGROUTER), "check-config", str(path)], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("config", ["systemd/logrouter.toml", "etc/logrouter.toml"])
def test_the_configs_are_valid_as_shipped_and_with_the_socket(config, tmp_path):
    text = (REPO / config).read_text()
    assert run_check_config(REPO / config).returncode == 0
    # The commented socket-activation example, switched on, matches logrouter.socket
    # (an IPv4 ListenStream is domain=INET) and passes check-config outside systemd.
    listen_stream = settings(SYSTEMD / "logrouter.socket")["ListenStream"]
    assert listen_stream == ["127.0.0.1:24224"]
    example = '# listen = "systemd:domain=INET:index=0"\n'
    assert example in text
    socket_config = re.sub(r'^listen = "tcp:24224:interface=127\.0\.0\.1"\n', "", text, flags=re.M)
    socket_config = socket_config.replace(example, example[2:])
    assert socket_config.count('listen = "systemd:') == 1 and 'listen = "tcp:24224' not in socket_config
    (tmp_path / "socket.toml").write_text(socket_config)
    result = run_check_config(tmp_path / "socket.toml")
    assert result.returncode == 0, result.stderr


def test_check_config_still_refuses_a_malformed_systemd_endpoint(tmp_path):
    (tmp_path / "bad.toml").write_text(
        '[spool]\npath = "spool"\n[sources.f]\ntype = "fluent_forward"\nlisten = "systemd:domain=INET"\n'
        '[sinks.lake]\ntype = "parquet"\ninputs = ["f"]\npath = "lake"\n'
    )
    result = run_check_config(tmp_path / "bad.toml")
    assert result.returncode == 1
    assert "sources.f.listen: bad endpoint 'systemd:domain=INET'" in result.stderr


def test_the_docs_install_what_the_units_expect():
    section = (REPO / "docs" / "operations" / "service.md").read_text()
    installed = re.findall(r"install -m 0644 (systemd/\S+) (\S+)", section)
    assert {source for source, _ in installed} == {"systemd/logrouter.toml", "systemd/logrouter.service", "systemd/logrouter.socket"}
    assert all((REPO / source).exists() for source, _ in installed)
    unit = settings(SYSTEMD / "logrouter.service")
    assert ("systemd/logrouter.toml", unit["ExecStart"][0].split("--config ")[1]) in installed
    assert f"python3 -m venv {PREFIX.removesuffix('/bin/')}" in section
    assert f"useradd --system --home-dir /var/lib/{unit['StateDirectory'][0]}" in section
    assert f"--shell /usr/sbin/nologin {unit['User'][0]}" in section
    assert 'listen = "systemd:domain=INET:index=0"' in section
