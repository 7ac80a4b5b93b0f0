"""The Twisted plugin cache in a system install: the service user cannot write
``twisted/plugins/dropin.cache`` next to the installed plugin, so a stale or missing
cache makes every start log "Unable to write to plugin cache"; ``logrouter plugin-cache``
(run as the owner, as the unit's ``ExecStartPre=+`` does) makes those starts quiet.

The install is a read-only ``twisted/plugins`` directory on ``PYTHONPATH`` holding the
plugin stub. The daemon runs as a user who cannot write it: ``nobody`` (with
CAP_DAC_READ_SEARCH, to read this venv wherever it lives) when the tests run as root,
else the test user itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from daemon import REPO, TWISTD, Daemon
from daemon_configs import FORWARD_TO_LAKE

LOGROUTER = TWISTD.parent / "logrouter"
CONFIG = FORWARD_TO_LAKE


def unprivileged() -> list[str]:
    """The command prefix that runs a command as a user who cannot write the install."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and setpriv (util-linux) is missing: cannot drop to a user")
    prefix = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups",
              "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    probe = subprocess.run([*prefix, "id", "-u"], capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.split()[:1] == ["0"]:
        pytest.skip(f"cannot drop to nobody here: {probe.stderr.strip()}")
    return prefix


class InstalledDaemon(Daemon):
    def __init__(self, workdir: Path, site: Path, prefix: list[str]) -> None:
        super().__init__(workdir, CONFIG)
        self.site = site
        self.prefix = prefix

    def start(self, wait_for: str = r"logrouter running", timeout: float = 60) -> "InstalledDaemon":
        env = dict(os.environ, PYTHONPATH=f"{self.site}:{REPO}", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [*self.prefix, str(TWISTD), "--nodaemon", "--pidfile=", "logrouter", "--config", str(self.config)],
            cwd=self.workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        if wait_for:
            self.wait_for(wait_for, timeout)
        return self


def plugin_cache(site: Path | None, prefix: list[str] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{site}:{REPO}" if site else str(REPO))
    return subprocess.run([*prefix, str(LOGROUTER), "plugin-cache"], capture_output=True, text=True, env=env)


def test_plugin_cache_makes_starts_as_the_service_user_quiet(tmp_path):
    prefix = unprivileged()
    site = tmp_path / "site"
    plugins = site / "twisted" / "plugins"
    plugins.mkdir(parents=True)
    shutil.copy(REPO / "twisted" / "plugins" / "logrouter_plugin.py", plugins)
    workdir = tmp_path / "work"
    workdir.mkdir()
    if prefix:
        os.chown(workdir, 65534, 65534)
    # The other plugin directories (this venv, the checkout) are ours and up to date.
    assert plugin_cache(None).returncode == 0
    cache = plugins / "dropin.cache"
    plugins.chmod(0o555)
    try:
        # Before: no cache the service user can write, so each start complains.
        with InstalledDaemon(workdir, site, prefix) as daemon:
            daemon.start()
            daemon.wait_for(rf"Unable to write to plugin cache {cache}")
            daemon.stop_gracefully()
        # The command says so too when run as a user who cannot fix it.
        refused = plugin_cache(site, prefix)
        assert refused.returncode == 1 and f"Unable to write to plugin cache {cache}" in refused.stderr, refused

        # The owner of the install refreshes it (the unit's ExecStartPre=+ as root).
        plugins.chmod(0o755)
        done = plugin_cache(site)
        assert done.returncode == 0 and str(plugins) in done.stdout, done
        assert cache.exists()
        plugins.chmod(0o555)

        for _ in range(2):  # and every later start is quiet
            with InstalledDaemon(workdir, site, prefix) as daemon:
                daemon.start()
                daemon.stop_gracefully()
                assert "plugin cache" not in daemon.output, daemon.output
        assert plugin_cache(site, prefix).returncode == 0
    finally:
        plugins.chmod(0o755)
