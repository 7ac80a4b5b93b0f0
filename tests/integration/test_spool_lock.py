"""One process per spool directory: a second router on the same spool refuses to start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon import Daemon
from logrouter.spool.lock import SpoolInUse, lock_spool

pytestmark = pytest.mark.timeout(120)


def test_a_held_spool_is_refused_and_names_its_holder(tmp_path: Path) -> None:
    fd = lock_spool(str(tmp_path / "spool"))
    try:
        with pytest.raises(SpoolInUse, match=rf"in use by another logrouter process \(pid {os.getpid()}\)"):
            lock_spool(str(tmp_path / "spool"))
    finally:
        os.close(fd)
    os.close(lock_spool(str(tmp_path / "spool")))  # free again once the holder is gone


CONFIG = """
[router]
workers = {workers}
[spool]
path = "{spool}"
[sources.forward]
type = "fluent_forward"
listen = "tcp:0:interface=127.0.0.1"
[sinks.out]
type = "blackhole"
inputs = ["forward"]
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_daemon_on_the_same_spool_exits_saying_why(tmp_path: Path, workers: int) -> None:
    spool = tmp_path / "spool"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Daemon(tmp_path / "a", CONFIG.format(workers=1, spool=spool)) as first:
        first.start()
        with Daemon(tmp_path / "b", CONFIG.format(workers=workers, spool=spool)) as second:
            second.start(wait_for="")
            assert second.process.wait(60) == 1, second.output
            assert f"spool directory {spool} is in use by another logrouter process (pid " in second.output
        first.stop_gracefully()
